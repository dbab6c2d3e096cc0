"""mempipe: a Ray pipeline for long-term conversational memory methods."""

__version__ = "0.1.0"
