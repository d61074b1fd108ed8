# The spconv 2.x API this package mirrors, plus this project's own development tag.
__version__ = "2.4.0.dev0"
