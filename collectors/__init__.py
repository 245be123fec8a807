"""Wire-format decoders and clients for the sources Prefixscope watches (no Django)."""
