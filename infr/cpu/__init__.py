"""numpy reference backend: the oracle every GPU kernel is tested against."""
