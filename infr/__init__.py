"""infr: a portable LLM inference engine in Python on WebGPU."""

__version__ = "0.1.0"
