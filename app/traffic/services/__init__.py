"""The only writers of traffic data, one module per kind of data."""
