"""The template check's shell: the repository, the tokenizer, builder commands and the server's traffic."""
