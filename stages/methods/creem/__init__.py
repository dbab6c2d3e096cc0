"""CREEM: a speaker's memory blended and refined turn by turn (the paper's phases are mapped in
`method.py`; its prompts in `prompts.py`)."""

from stages.methods.creem.method import (Creem, CreemNoPreblend, CreemNoPreblendSettings, CreemNoRefine,
                                         CreemNoRefineSettings, CreemSettings, EVOLUTION, EVOLUTION_SUMMARY, MEMORIES)

__all__ = ["Creem", "CreemNoPreblend", "CreemNoPreblendSettings", "CreemNoRefine", "CreemNoRefineSettings",
           "CreemSettings", "EVOLUTION", "EVOLUTION_SUMMARY", "MEMORIES"]
