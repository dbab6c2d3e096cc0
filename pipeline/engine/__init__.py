"""What runs stages: the stage contract (`stage`), the runner and its selection, shards, fingerprints
and the code they cover (`code_closure`), progress lines, the spend record, and the executors
(`execution`: inline and Ray). None of it decides a stage's rows, so no stage's fingerprint includes
it (pipeline.engine.code_closure)."""
