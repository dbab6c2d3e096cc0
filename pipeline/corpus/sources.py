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

from pipeline.corpus import beam_manifest

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
    use: str = ""  # the settings that read it, printed after a fetch ({dir}: the data directory)

    @property
    def verified(self) -> bool:
        return bool(self.files) and all(f.sha256 is not None for f in self.files)


_HF = "https://huggingface.co/datasets"
_MAB_SPLITS = ("Accurate_Retrieval", "Test_Time_Learning", "Long_Range_Understanding", "Conflict_Resolution")
# MemoryAgentBench's movie entities (recsys), relative to the data directory
MAB_ENTITIES = "memoryagentbench_entities/entity2id.json"
_MSC_CONFIGS = ("creem_msc.yaml", "ldagent_msc.yaml", "rsum_msc.yaml", "theanine_msc.yaml",
                "theanine_msc_cc.yaml", "teafarm_msc_cc.yaml")
# dial481/locomo-audit's per-conversation errors, at one commit: the files are read from the commit's tree.
_AUDIT_COMMIT = "9493fb4b4af4256ed17a18e8fd0b3cfdeec29539"
_AUDIT_SHA256 = (
    "63c778c8432b058d791417ec37bf8ac30b0bb83b1272afacb5a162b84fe5e3c4",
    "a2db16644318c3c144544f4cb373028e416bbf20c6f07f46606cf66f45de4e6c",
    "93c2aa8ee7d3bfb59ae1cca283d176a794d76d3751c69264ddc1f63ceb2b4b3a",
    "c1d0162e534bf68dba6aff3ca3e73ba8179cab7a400d098b8be89048c7b58585",
    "42520f95b654c85b564da6cd26f40cefb981de574066f7b92bdebbc780fa1376",
    "af8c675a3e216ddb94e07c417fb37c45fc46740dfa8ce586fc8c527f7a3b9ee7",
    "acb6d0d02f938180b3d1a7a45f80d432ece69d13b197371cb71ddbddb83a26ea",
    "bbe2268a3254dcc9d3741a84748fadf8e169d21d837810e92dc63cdf8db562cb",
    "c15ace8ef1a7cbf3fe63d3b7ff9c2851885f5e00abc1c184971ebb11128aedb2",
    "2c2b8791d024e11ca6015a109f160b7177379b3b42ac8c9adb990546fc89c4ff",
)
_LME_NOTE = ("The cleaned release (2025/09) the LongMemEval README links; the first release "
             "(xiaowu0162/longmemeval) reads the same way.")

# xjtuleeyf/Locomo-Plus's data files at one commit (read from the commit's tree).
_LOCOMO_PLUS_COMMIT = "059f4e3d38f7f1f96765e8e2cb7de3097551bffb"
_LOCOMO_PLUS_SHA256 = (
    ("locomo_plus.json", "af2fc6e5e0e88735e28d8dd1ef474b718861a73beb21779809e3b9e1a4fe3d23"),
    ("locomo10.json", "79fa87e90f04081343b8c8debecb80a9a6842b76a7aa537dc9fdf651ea698ff4"),
)



def _beam_files(directory: str, sizes: tuple[str, ...]) -> tuple[RemoteFile, ...]:
    """BEAM's files of `sizes` at the manifest's commit (pipeline/corpus/beam_manifest.py), under `directory`."""
    commit = beam_manifest.COMMIT
    return tuple(RemoteFile(
        f"https://raw.githubusercontent.com/mohammadtavakoli78/BEAM/{commit}/chats/{path}", f"{directory}/{path}",
        sha, sha256_source=f"the file at mohammadtavakoli78/BEAM commit {commit[:12]}" if sha else None)
        for path, sha in beam_manifest.files(sizes))


_BEAM_NOTE = ("Per conversation the chat the release's answer_generation.py reads (chat_trunecated.json, the chat "
              "cut to its size's token budget, where the folder has one; else chat.json) and "
              "probing_questions/probing_questions.json, from the repository's chats/ at the commit in the URLs "
              "(2025-11-11; the hub's Mohammadta/BEAM and Mohammadta/BEAM-10M hold the same conversations as "
              "`datasets` rows). A file whose sha256 is recorded is checked against it; the larger files, whose "
              "blobs the snapshot read here lacked, are pinned at the first fetch. ")

# IAAR-Shanghai/HaluMem's two versions, one JSON Lines file each (the names the release's eval scripts read).
_HALUMEM_FILES = ("HaluMem-Medium.jsonl", "HaluMem-Long.jsonl")
_HALUMEM_NOTE = (
    "Both versions from the hub's main, unverified: neither the files nor a hub revision holding both could "
    "be read here (others' scripts pin Medium at revision cb04336aa1b7 with sha256 486fbc130a5c..., not "
    "recorded as it was not read from the file), so the first fetch pins each file's sha256 in "
    ".mempipe-pins.json and a later change is refused. Halu-Medium (~34 MB): 20 users, ~70 "
    "sessions and ~160K tokens each, 14,948 gold memory points, 3,467 questions. Halu-Long (~107 MB): the "
    "same users, memory points and questions, ~1M tokens each: unrelated question-answer pairs (math, ELI5) "
    "inserted into the sessions and as sessions of their own (is_generated_qa_session: history, no memory points "
    "or questions). "
    "corpus.path names Medium; Long: --set corpus.path=data/halumem/HaluMem-Long.jsonl (one file at a time: "
    "both hold the same users, so the directory is not a corpus). Sizes are as others report them. Licence "
    "CC BY-NC-ND 4.0: non-commercial use only, fetched, never shipped.")

SOURCES: tuple[CorpusSource, ...] = (
    CorpusSource(
        name="locomo",
        description="LoCoMo (Maharana et al. 2024): 10 very long conversations with QA (locomo10.json)",
        homepage="https://github.com/snap-research/locomo",
        corpus_format="locomo",
        corpus_path="locomo10.json",
        files=(RemoteFile("https://raw.githubusercontent.com/snap-research/locomo/main/data/locomo10.json",
                          "locomo10.json", None),),
        configs=("secom_locomo.yaml", "locomo_memory_systems.yaml", "locomo_judge_panel.yaml"),
        notes="Unverified: the repository snapshot readable here (2024-08) ships data/locomo10.zip "
              "(per-conversation files), not the later data/locomo10.json.",
    ),
    CorpusSource(
        name="locomo-audit",
        description="LoCoMo answer-key audit (dial481/locomo-audit): the gold answers it finds wrong, per "
                    "conversation; CC BY-NC 4.0, non-commercial use only, so fetched, never shipped",
        homepage="https://github.com/dial481/locomo-audit",
        corpus_format=None,
        corpus_path=None,
        files=tuple(RemoteFile(
            f"https://raw.githubusercontent.com/dial481/locomo-audit/{_AUDIT_COMMIT}/audit/errors_conv_{n}.json",
            f"locomo-audit/errors_conv_{n}.json", sha,
            sha256_source=f"the file at dial481/locomo-audit commit {_AUDIT_COMMIT[:12]}")
            for n, sha in enumerate(_AUDIT_SHA256)),
        notes="Not a corpus: LoCoMo's audited answer key (corpus.answer_key: audited, pipeline/corpus/locomo_audit.py) "
              "reads it beside locomo10.json. Licence CC BY-NC 4.0 (the audit's, as LoCoMo's own): "
              "non-commercial use only. Pinned at the commit named in the URLs (2026-04-02; the files are "
              "unchanged since the audit's first commit ded8d0f).",
        use="corpus.answer_key=audited corpus.audit_path={dir}/locomo-audit",
    ),
    CorpusSource(
        name="locomo-plus",
        description="LoCoMo-Plus (Li et al. 2026): 401 cue/trigger items of a sixth, cognitive category, and "
                    "the LoCoMo conversations they are stitched into",
        homepage="https://github.com/xjtuleeyf/Locomo-Plus",
        corpus_format="locomo_plus",
        corpus_path="locomo-plus",
        files=tuple(RemoteFile(
            f"https://raw.githubusercontent.com/xjtuleeyf/Locomo-Plus/{_LOCOMO_PLUS_COMMIT}/data/{name}",
            f"locomo-plus/{name}", sha,
            sha256_source=f"the file at xjtuleeyf/Locomo-Plus commit {_LOCOMO_PLUS_COMMIT[:12]}")
            for name, sha in _LOCOMO_PLUS_SHA256),
        configs=("locomo_plus.yaml",),
        notes="Both files from the release's data/ at the commit in the URLs (2026-02-13): the loader reads the "
              "directory and stitches cue item i into conversation i mod 10, as the release's unified_input.py does. "
              "The release's locomo10.json is used (not `mempipe data fetch locomo`'s) so the pairing reads the "
              "file the release read.",
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
        configs=("longmemeval_m.yaml",),
        notes=_LME_NOTE,
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
        name="memoryagentbench",
        description="MemoryAgentBench (Hu, Wang and McAuley 2025): its four competency splits, each context "
                    "with its questions",
        homepage=f"{_HF}/ai-hyz/MemoryAgentBench",
        corpus_format="memoryagentbench",
        corpus_path="memoryagentbench",
        files=(*(RemoteFile(
            f"{_HF}/ai-hyz/MemoryAgentBench/resolve/main/data/{split}-00000-of-00001.parquet",
            f"memoryagentbench/{split}-00000-of-00001.parquet", None, unpack="parquet_to_jsonl",
            output=f"memoryagentbench/{split}.jsonl") for split in _MAB_SPLITS),
            # Beside the corpus directory, not in it: the loader reads every .json file there as a corpus file.
            RemoteFile(f"{_HF}/ai-hyz/MemoryAgentBench/resolve/main/entity2id.json", MAB_ENTITIES, None)),
        configs=("memoryagentbench.yaml",),
        notes="The release's data/ files (one Parquet file per split, as the official loader reads them with "
              "`datasets`), each written as JSON Lines, one row a line; the loader reads the directory and "
              "takes each file's competency from its name. entity2id.json (the movie entities the recsys "
              "task's scorer maps gold ids and recommendations to titles with) is kept as published, beside "
              "the directory. The files are read from main, which the authors still update: the first fetch "
              "pins their sha256, and a later change is refused.",
        use="response_metrics.memoryagentbench_entities={dir}/" + MAB_ENTITIES,
    ),
    CorpusSource(
        name="beam",
        description="BEAM (Tavakoli et al. 2026, Beyond a Million Tokens): 90 user-assistant conversations of "
                    "128K, 500K and 1M tokens (20/35/35), each with probing questions over ten memory abilities",
        homepage="https://github.com/mohammadtavakoli78/BEAM",
        corpus_format="beam",
        corpus_path="beam",
        files=_beam_files("beam", ("100K", "500K", "1M")),
        configs=("beam.yaml",),
        notes=_BEAM_NOTE + "Kept in the release's layout, beam/<size>/<id>/; one size alone: "
                           "--set corpus.path=data/beam/100K. The 10M conversations: `mempipe data fetch beam-10m`.",
    ),
    CorpusSource(
        name="beam-10m",
        description="BEAM-10M (Tavakoli et al. 2026): 10 user-assistant conversations of 10M tokens (~20,900 "
                    "messages each) with their probing questions",
        homepage="https://github.com/mohammadtavakoli78/BEAM",
        corpus_format="beam",
        corpus_path="beam-10m",
        files=_beam_files("beam-10m", ("10M",)),
        notes=_BEAM_NOTE + "A 10M conversation's chat is the release's combined one (chats/10M/<id>/, its plans' "
                           "batches in one list, messages numbered in one sequence as the probing questions cite "
                           "them; the plan-<k>/ folders are not needed). Kept apart from beam/ so that a config "
                           "reading data/beam never loads them: --set corpus.path=data/beam-10m.",
    ),
    CorpusSource(
        name="halumem",
        description="HaluMem (Chen et al. 2025): 20 users' sessions with an assistant, each session's gold memory "
                    "points and questions; Halu-Medium and Halu-Long",
        homepage=f"{_HF}/IAAR-Shanghai/HaluMem",
        corpus_format="halumem",
        corpus_path="halumem/HaluMem-Medium.jsonl",
        files=tuple(RemoteFile(f"{_HF}/IAAR-Shanghai/HaluMem/resolve/main/{name}", f"halumem/{name}", None)
                    for name in _HALUMEM_FILES),
        configs=("halumem.yaml",),
        notes=_HALUMEM_NOTE,
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
    "locomo_plus": ("locomo-plus",),
    "memoryagentbench": ("memoryagentbench",),
    "beam": ("beam", "beam-10m"),
    "halumem": ("halumem",),
}
