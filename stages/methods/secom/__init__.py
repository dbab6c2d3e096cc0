"""SeCom (Pan et al., seed 001): segment-level memory built by LLM conversation segmentation.

Where each phase lives:
- Sec. 2.2 segmentation: `segmentation.py` (run by the `segment` stage);
- Sec. 2.2 / App. A.1 reflection-learned guidance: `reflection.py` (the `guidance` stage);
- memory units (turn / session / segment): `units.py`, built by `stages/methods/secom/stages/compress.py`;
- Sec. 2.3 compression-based denoising: `stages/methods/secom/stages/compress.py` with `pipeline/compression.py`;
- banks (embedded units in Lance): `stages/methods/secom/stages/banks.py`;
- Sec. 2.1 retrieval and response, and the turn / session baselines: `retrieval.py`.
"""
