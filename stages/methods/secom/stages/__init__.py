"""SeCom's memory units, built once per run for the turn-, session- and segment-level methods:
`guidance` learns a segmentation rubric (optional), `segment` cuts sessions into topical
segments, `compress` builds the units of every granularity and denoises them, `banks` embeds them
into Lance tables. The units themselves are defined in `stages/methods/secom/units.py`."""
