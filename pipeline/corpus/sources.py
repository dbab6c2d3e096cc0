"""Where each corpus a config names is published, and the sha256 of each file where it can be read.

A sha256 is recorded here only when it was read from the public file itself or from its publisher's own
record (`sha256_source` says which); every other file is unverified (`sha256=None`): `mempipe data
fetch` pins the hash it finds at the first download in `<dir>/.mempipe-pins.json` and refuses a file
that differs later. File names are relative to the data directory (`--dir`, default `data/`), laid out
so that each config's default `corpus.path` is found without a `--set`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# How a downloaded file becomes the file our loader reads (pipeline/corpus/fetch.py applies it with a
# pooch processor): None, the file as published; "untar", one member of a tar archive; "parquet_to_jsonl",
# a Parquet table written as JSON Lines, one row a line (what `datasets`' to_json writes).
Unpack = Literal["untar", "parquet_to_jsonl"]


@dataclass(frozen=True)
class RemoteFile:
    url: str
    fname: str  # where the download is kept, relative to the data directory
    sha256: str | None  # of the downloaded file; None: unverified, pinned at the first fetch
    sha256_source: str | None = None  # where the recorded hash was read
    unpack: Unpack | None = None
    member: str | None = None  # "untar": the archive member to extract
    output: str | None = None  # the file the loader reads, relative to the data directory (default: fname)

    @property
    def target(self) -> str:
        return self.output or self.fname


@dataclass(frozen=True)
class CorpusSource:
    name: str
    description: str
    homepage: str
    corpus_format: str | None  # the `corpus.format` that reads it (None: not a corpus of its own)
    corpus_path: str | None  # relative to the data directory: what `corpus.path` names
    files: tuple[RemoteFile, ...] = ()
    configs: tuple[str, ...] = ()  # configs/ files whose corpus (or corpus.extra) reads it
    notes: str = ""

    @property
    def verified(self) -> bool:
        return bool(self.files) and all(f.sha256 is not None for f in self.files)


_HF = "https://huggingface.co/datasets"
_MSC_CONFIGS = ("creem_msc.yaml", "ldagent_msc.yaml", "rsum_msc.yaml", "theanine_msc.yaml",
                "theanine_msc_cc.yaml", "teafarm_msc_cc.yaml")
_LME_NOTE = ("The cleaned release (2025/09) the LongMemEval README links; the first release "
             "(xiaowu0162/longmemeval) reads the same way.")

SOURCES: tuple[CorpusSource, ...] = (
    CorpusSource(
        name="locomo",
        description="LoCoMo (Maharana et al. 2024): 10 very long conversations with QA (locomo10.json)",
        homepage="https://github.com/snap-research/locomo",
        corpus_format="locomo",
        corpus_path="locomo10.json",
        files=(RemoteFile("https://raw.githubusercontent.com/snap-research/locomo/main/data/locomo10.json",
                          "locomo10.json", None),),
        configs=("secom_locomo.yaml", "locomo_memory_systems.yaml"),
        notes="Unverified: the repository snapshot readable here (2024-08) ships data/locomo10.zip "
              "(per-conversation files), not the later data/locomo10.json.",
    ),
    CorpusSource(
        name="msc",
        description="Multi-Session Chat (Xu et al. 2022), ParlAI release: session 5 test split",
        homepage="https://parl.ai/projects/msc/",
        corpus_format="msc",
        corpus_path="msc/session_5_test.jsonl",
        files=(RemoteFile(
            "http://parl.ai/downloads/msc/msc_v0.1.tar.gz", "msc/msc_v0.1.tar.gz",
            "e640e37cf4317cd09fc02a4cd57ef130a185f23635f4003b0cee341ffcb45e60",
            sha256_source="ParlAI parlai/tasks/msc/build.py (RESOURCES)",
            unpack="untar", member="msc/msc_dialogue/session_5/test.txt",
            output="msc/session_5_test.jsonl"),),
        configs=_MSC_CONFIGS,
        notes="A tar.gz of every MSC split; session_5/test.txt (JSON Lines, ParlAI layout) is extracted "
              "to msc/session_5_test.jsonl, the archive is kept beside it (its hash is what is checked).",
    ),
    CorpusSource(
        name="cc",
        description="Conversation Chronicles (Jang et al. 2023): test split, JSON Lines",
        homepage=f"{_HF}/jihyoung/ConversationChronicles",
        corpus_format="cc",
        corpus_path="cc/test.json",
        files=(RemoteFile(f"{_HF}/jihyoung/ConversationChronicles/resolve/main/test.jsonl", "cc/test.json", None),),
        configs=("theanine_cc.yaml", "theanine_msc_cc.yaml", "teafarm_msc_cc.yaml"),
        notes="Published as test.jsonl (169 MB); kept as cc/test.json, the path the configs name "
              "(the reader reads JSON Lines in a .json file).",
    ),
    CorpusSource(
        name="longmemeval-s",
        description="LongMemEval_S (Wu et al. 2024), cleaned: 500 questions, ~115K-token haystacks",
        homepage=f"{_HF}/xiaowu0162/longmemeval-cleaned",
        corpus_format="longmemeval",
        corpus_path="longmemeval_s_cleaned.json",
        files=(RemoteFile(f"{_HF}/xiaowu0162/longmemeval-cleaned/resolve/main/longmemeval_s_cleaned.json",
                          "longmemeval_s_cleaned.json", None),),
        configs=("longmemeval.yaml",),
        notes=_LME_NOTE,
    ),
    CorpusSource(
        name="longmemeval-m",
        description="LongMemEval_M (Wu et al. 2024), cleaned: ~500 sessions a haystack (2.7 GB)",
        homepage=f"{_HF}/xiaowu0162/longmemeval-cleaned",
        corpus_format="longmemeval",
        corpus_path="longmemeval_m_cleaned.json",
        files=(RemoteFile(f"{_HF}/xiaowu0162/longmemeval-cleaned/resolve/main/longmemeval_m_cleaned.json",
                          "longmemeval_m_cleaned.json", None),),
        notes=_LME_NOTE + " No config names it: --set corpus.path=data/longmemeval_m_cleaned.json.",
    ),
    CorpusSource(
        name="longmemeval-oracle",
        description="LongMemEval oracle (Wu et al. 2024): the evidence sessions only",
        homepage=f"{_HF}/xiaowu0162/longmemeval-cleaned",
        corpus_format="longmemeval",
        corpus_path="longmemeval_oracle.json",
        files=(RemoteFile(f"{_HF}/xiaowu0162/longmemeval-cleaned/resolve/main/longmemeval_oracle.json",
                          "longmemeval_oracle.json", None),),
        notes=_LME_NOTE + " No config names it: --set corpus.path=data/longmemeval_oracle.json.",
    ),
    CorpusSource(
        name="dialseg711",
        description="DialSeg711 (Xu et al. 2021) as SuperDialseg converted it: test set, {\"dial_data\": ...}",
        homepage=f"{_HF}/Coldog2333/dialseg711",
        corpus_format="dialseg",
        corpus_path="dialseg711.json",
        files=(RemoteFile(f"{_HF}/Coldog2333/dialseg711/resolve/main/test.json", "dialseg711.json", None),),
        configs=("secom_dialseg.yaml",),
    ),
    CorpusSource(
        name="tiage",
        description="TIAGE (Xie et al. 2021) as SuperDialseg converted it: test and train sets",
        homepage=f"{_HF}/Coldog2333/tiage",
        corpus_format="dialseg",
        corpus_path="tiage/test.json",
        files=(RemoteFile(f"{_HF}/Coldog2333/tiage/resolve/main/test.json", "tiage/test.json", None),
               RemoteFile(f"{_HF}/Coldog2333/tiage/resolve/main/train.json", "tiage/train.json", None)),
        configs=("secom_dialseg.yaml",),
        notes="secom_dialseg.yaml's TIAGE row: --set corpus.path=data/tiage/test.json; its reflection "
              "set: --set segment.reflection.corpus_path=data/tiage/train.json.",
    ),
    CorpusSource(
        name="superdialseg",
        description="SuperDialseg (Jiang et al. 2023): train, validation and test sets",
        homepage=f"{_HF}/Coldog2333/super_dialseg",
        corpus_format="dialseg",
        corpus_path="superdialseg/test.json",
        files=tuple(RemoteFile(f"{_HF}/Coldog2333/super_dialseg/resolve/main/{split}.json",
                               f"superdialseg/{split}.json", None) for split in ("test", "validation", "train")),
        configs=("secom_dialseg.yaml",),
        notes="secom_dialseg.yaml's reflection on SuperDialseg: "
              "--set segment.reflection.corpus_path=data/superdialseg/train.json.",
    ),
    CorpusSource(
        name="longmtbench",
        description="Long-MT-Bench+ (SeCom, Pan et al. 2025): test split",
        homepage=f"{_HF}/panzs19/Long-MT-Bench-Plus",
        corpus_format="longmtbench",
        corpus_path="long_mt_bench_plus.jsonl",
        files=(RemoteFile(
            f"{_HF}/panzs19/Long-MT-Bench-Plus/resolve/refs%2Fconvert%2Fparquet/default/test/0000.parquet",
            "long_mt_bench_plus.parquet", None, unpack="parquet_to_jsonl", output="long_mt_bench_plus.jsonl"),),
        configs=("secom_longmtbench.yaml",),
        notes="Read from the Hub's Parquet conversion of the test split (the release is a `datasets` "
              "dataset; SeCom's download_data.py exports it to JSON Lines) and written as JSON Lines, "
              "one row a line. The Parquet path is the Hub's standard conversion path, not read from a "
              "listing here: if it moves, fetch the split with `datasets` as SeCom does.",
    ),
    CorpusSource(
        name="teabag",
        description="TeaBag (Theanine, Ong et al. 2025): the ids of its 50 MSC + 50 CC episodes",
        homepage=f"{_HF}/LangAGI-Lab/teafarm",
        corpus_format=None,
        corpus_path=None,
        configs=("teafarm_msc_cc.yaml", "theanine_msc.yaml", "theanine_cc.yaml", "theanine_msc_cc.yaml"),
        notes="No file of this dataset could be read here, so no URL is recorded: download it from the "
              "homepage and give its episode ids as corpus.episode_ids (README, \"Reproducing Theanine\"); "
              "the episodes themselves come from `mempipe data fetch msc` and `mempipe data fetch cc`.",
    ),
)

REGISTRY: dict[str, CorpusSource] = {s.name: s for s in SOURCES}

# corpus.format -> the registry names that publish a corpus of that format, the usual one first
FORMAT_SOURCES: dict[str, tuple[str, ...]] = {
    "locomo": ("locomo",),
    "msc": ("msc",),
    "cc": ("cc",),
    "longmemeval": ("longmemeval-s", "longmemeval-m", "longmemeval-oracle"),
    "dialseg": ("dialseg711", "tiage", "superdialseg"),
    "longmtbench": ("longmtbench",),
}
