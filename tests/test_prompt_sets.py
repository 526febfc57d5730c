"""Named prompt sets (digenrl/prompt_sets): split choice, cache, digests, offline errors and
the config keys, against small fixture files served by a fake urlopen (no network)."""

from __future__ import annotations

import dataclasses
import hashlib
import io
from pathlib import Path
from urllib.error import URLError

import pytest

from digenrl.config.errors import ConfigError
from digenrl.config.schema import load_config
from digenrl.data import load_prompts
from digenrl.tools.preflight import check_inputs
from digenrl.prompt_sets import PROMPT_SETS, PromptSetError, cache_path, fetch, prompt_metadata
from digenrl.prompt_sets import cache
from digenrl.prompt_sets.cache import git_blob_sha1

FIXTURES = Path(__file__).parent / "fixtures" / "prompt_sets"
JPEG = "reward.weights={jpeg-compressibility: 1.0}"  # toy-geneval judges toy prompts only


def _lines(name: str, filename: str) -> list[str]:
    return [ln.strip() for ln in (FIXTURES / name / filename).read_text().splitlines() if ln.strip()]


@pytest.fixture
def served(monkeypatch, tmp_path):
    """Every registered set re-pointed at its fixture files (digests computed here from the
    fixtures), an empty cache under tmp_path, and a fake urlopen serving the files at the
    first (flow_grpo) URL. Yields {url: bytes} (tests may edit it) and the requested URLs."""
    monkeypatch.setenv("DIGENRL_CACHE", str(tmp_path / "cache"))
    for var in cache.OFFLINE_VARS:
        monkeypatch.delenv(var, raising=False)
    files: dict[str, bytes] = {}
    for name, s in list(PROMPT_SETS.items()):
        splits = {}
        for split, f in s.splits.items():
            data = (FIXTURES / name / f.filename).read_bytes()
            splits[split] = dataclasses.replace(f, git_sha1=git_blob_sha1(data),
                                                sha256=hashlib.sha256(data).hexdigest(), size=len(data))
            files[splits[split].urls()[0]] = data
        monkeypatch.setitem(PROMPT_SETS, name, dataclasses.replace(s, splits=splits))
    requested: list[str] = []

    def fake_urlopen(url, timeout=None):
        requested.append(url)
        if url not in files:
            raise URLError("[Errno -2] Name or service not known")
        return io.BytesIO(files[url])

    monkeypatch.setattr(cache, "urlopen", fake_urlopen)
    return files, requested


def test_git_blob_sha1_is_gits_blob_id():
    # `git hash-object` of an empty file and of "hello\n"
    assert git_blob_sha1(b"") == "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"
    assert git_blob_sha1(b"hello\n") == "ce013625030ba8dba906f756967f9e9ca394464a"


def test_registry_pins_every_file():
    for s in PROMPT_SETS.values():
        assert "test" in s.splits and s.license and s.upstream_license and s.citation
        for f in s.splits.values():
            assert len(f.git_sha1) == 40 and (f.sha256 is None or len(f.sha256) == 64)
            assert all(s.revision in url or "DiffusionNFT" in url for url in f.urls())
    assert "train" not in PROMPT_SETS["drawbench"].splits  # flow_grpo's train.txt is a 1-line placeholder


def test_bare_name_is_the_train_split_held_out_the_test_split(served):
    assert load_prompts("pickscore") == _lines("pickscore", "train.txt")
    assert load_prompts("pickscore", held_out=True) == _lines("pickscore", "test.txt")
    assert load_prompts("pickscore:test") == _lines("pickscore", "test.txt")
    assert load_prompts("pickscore:train", held_out=True) == _lines("pickscore", "train.txt")
    # a line starting with '#' is a prompt in a named set (files given by path skip them)
    assert "#hashtag prompts are prompts too, not comments" in load_prompts("pickscore")


def test_second_load_reads_the_cache(served):
    _, requested = served
    first = load_prompts("ocr:test")
    path = cache_path(PROMPT_SETS["ocr"], "test")
    assert path.is_file() and requested == [PROMPT_SETS["ocr"].splits["test"].urls()[0]]
    assert load_prompts("ocr:test") == first and len(requested) == 1
    assert PROMPT_SETS["ocr"].revision in str(path)
    assert [p.name for p in path.parent.iterdir()] == ["test.txt"]  # no temporary file left behind


def test_a_changed_cached_file_is_refused_naming_it_and_both_digests(served):
    load_prompts("pickscore")
    path = cache_path(PROMPT_SETS["pickscore"], "train")
    path.write_text("something else\n")
    with pytest.raises(PromptSetError) as e:
        load_prompts("pickscore")
    f = PROMPT_SETS["pickscore"].splits["train"]
    got = git_blob_sha1(b"something else\n")
    assert str(path) in str(e.value) and f.git_sha1 in str(e.value) and got in str(e.value)


def test_without_a_recorded_sha256_the_git_blob_id_still_guards(served, monkeypatch):
    s = PROMPT_SETS["geneval"]
    f = dataclasses.replace(s.splits["train"], sha256=None)
    monkeypatch.setitem(PROMPT_SETS, "geneval", dataclasses.replace(s, splits={**s.splits, "train": f}))
    load_prompts("geneval")
    cache_path(s, "train").write_text('{"prompt": "x"}\n')
    with pytest.raises(PromptSetError, match="git blob sha1 mismatch"):
        load_prompts("geneval")


def test_a_download_with_other_bytes_is_refused_and_not_cached(served):
    files, _ = served
    url = PROMPT_SETS["drawbench"].splits["test"].urls()[0]
    files[url] = b"tampered\n"
    with pytest.raises(PromptSetError) as e:
        load_prompts("drawbench:test")
    assert url in str(e.value) and "sha1 mismatch" in str(e.value)
    assert not cache_path(PROMPT_SETS["drawbench"], "test").exists()


def test_the_second_mirror_is_tried(served):
    files, requested = served
    f = PROMPT_SETS["pickscore"].splits["test"]
    files[f.urls()[1]] = files.pop(f.urls()[0])  # only DiffusionNFT's copy answers
    assert load_prompts("pickscore:test") == _lines("pickscore", "test.txt")
    assert requested == list(f.urls())


@pytest.mark.parametrize("offline_var", ["HF_HUB_OFFLINE", "DIGENRL_OFFLINE"])
def test_offline_and_not_cached_says_what_to_run_and_where_to_copy(served, monkeypatch, offline_var):
    _, requested = served
    monkeypatch.setenv(offline_var, "1")
    with pytest.raises(PromptSetError) as e:
        load_prompts("pickscore", held_out=True)
    message = str(e.value)
    assert requested == []  # offline: the network is not tried
    for part in ("'pickscore'", "test split", f"{offline_var}=1", PROMPT_SETS["pickscore"].splits["test"].urls()[0],
                 "digenrl prompts fetch pickscore --split test", str(cache_path(PROMPT_SETS["pickscore"], "test"))):
        assert part in message
    # once the file is there (copied in), offline is fine
    monkeypatch.delenv(offline_var)
    load_prompts("pickscore:test")
    monkeypatch.setenv(offline_var, "1")
    assert load_prompts("pickscore", held_out=True) == _lines("pickscore", "test.txt")


def test_no_network_names_each_url_tried(served):
    files, requested = served
    files.clear()
    with pytest.raises(PromptSetError) as e:
        load_prompts("ocr")
    assert requested == list(PROMPT_SETS["ocr"].splits["train"].urls())
    assert all(url in str(e.value) for url in requested) and "digenrl prompts fetch ocr --split train" in str(e.value)


def test_geneval_prompts_and_metadata(served):
    assert load_prompts("geneval") == ["a photo of three kites", "a photo of a green bench"]
    # file order, repeats kept (the test file lists each prompt several times)
    assert load_prompts("geneval", held_out=True) == ["a photo of a chair left of a cat", "a photo of an umbrella",
                                                      "a photo of a chair left of a cat"]
    meta = prompt_metadata("geneval", "test")
    assert set(meta) == {"a photo of a chair left of a cat", "a photo of an umbrella"}
    assert meta["a photo of a chair left of a cat"]["include"][1] == {"class": "chair", "count": 1,
                                                                      "position": ["left of", 0]}
    assert meta["a photo of an umbrella"]["tag"] == "single_object"
    assert prompt_metadata("geneval", "train")["a photo of three kites"]["exclude"] == [{"class": "kite", "count": 4}]
    with pytest.raises(PromptSetError, match="no prompt metadata"):
        prompt_metadata("pickscore", "test")
    with pytest.raises(PromptSetError, match="no split 'valid'"):
        prompt_metadata("geneval", "valid")


def test_geneval_metadata_that_disagrees_for_one_prompt_is_refused(served, monkeypatch):
    files, _ = served
    s = PROMPT_SETS["geneval"]
    data = (b'{"tag": "colors", "include": [], "prompt": "a red cup"}\n'
            b'{"tag": "counting", "include": [], "prompt": "a red cup"}\n')
    f = dataclasses.replace(s.splits["test"], git_sha1=git_blob_sha1(data), sha256=hashlib.sha256(data).hexdigest())
    files[f.urls()[0]] = data
    monkeypatch.setitem(PROMPT_SETS, "geneval", dataclasses.replace(s, splits={**s.splits, "test": f}))
    with pytest.raises(PromptSetError, match="two different metadata rows"):
        prompt_metadata("geneval", "test")


# ---- config keys: refused before any work, the key named ----

@pytest.mark.parametrize("override, key, says", [
    ("data.prompts=drawbench", "data.prompts", "drawbench:test"),  # a benchmark: train on it only explicitly
    ("data.prompts=pickscore:dev", "data.prompts", "splits: train, test"),
    ("data.eval_prompts=ocr:valid", "data.eval_prompts", "splits: train, test"),
    ("data.prompts=pickscor:train", "data.prompts", "pickscore, ocr, geneval, drawbench"),
    ("data.eval_prompts=drawbench:train", "data.eval_prompts", "splits: test"),
])
def test_config_refuses_a_wrong_set_or_split(override, key, says):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override, JPEG])
    assert str(e.value).startswith(f"{key}:") and says in str(e.value)


def test_config_accepts_sets_and_pairs_the_held_out_split():
    cfg = load_config(None, ["data.prompts=pickscore", JPEG])
    assert cfg.data.eval_prompts == "auto" and cfg.data.held_out_prompts() == "pickscore:test"
    assert load_config(None, ["data.prompts=drawbench:test", JPEG]).data.held_out_prompts() == "drawbench:test"
    assert load_config(None, ["data.prompts=geneval:train", JPEG]).data.held_out_prompts() == "geneval:test"
    assert load_config(None, ["data.eval_prompts=drawbench", JPEG]).data.held_out_prompts() == "drawbench"
    assert load_config(None, []).data.held_out_prompts() == "toy-held-out"  # toy pairs with toy-held-out, as before
    assert load_config(None, ["data.prompts=/p/train.txt", JPEG]).data.held_out_prompts() == "toy-held-out"
    mixed = load_config(None, ["data.prompts=ocr", "data.eval_prompts=pickscore", JPEG])
    assert mixed.data.held_out_prompts() == "pickscore"  # read as its test split (held_out=True)


def test_an_unknown_bare_name_is_refused_before_the_run_listing_the_sets(served):
    cfg = load_config(None, ["data.prompts=pickscor", JPEG])  # could be a file: checked on disk
    with pytest.raises(ConfigError) as e:
        check_inputs(cfg)
    assert "data.prompts: prompt file 'pickscor' not found" in str(e.value)
    assert "pickscore, ocr, geneval, drawbench" in str(e.value)


def test_preflight_fetches_both_splits_and_reports_an_offline_set_by_key(served, monkeypatch):
    _, requested = served
    check_inputs(load_config(None, ["data.prompts=pickscore", JPEG, "run.mode=local"]))
    assert len(requested) == 2  # train and test, before the run starts
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError) as e:
        check_inputs(load_config(None, ["data.prompts=ocr", JPEG, "run.mode=local"]))
    assert "data.prompts: prompt set 'ocr'" in str(e.value) and "data.eval_prompts: prompt set 'ocr'" in str(e.value)


def test_digenrl_train_with_a_named_set_reads_the_cached_fixture(served, tiny_overrides, monkeypatch):
    from digenrl.tools.cli import main
    from digenrl.train.trainer import Trainer

    class Built(Exception):
        pass

    seen = {}

    def stop(self, resume=False):  # the Trainer is built for real; the RL steps do not run
        seen["train"], seen["eval"] = self.source.prompts, self.evaluator.prompts
        raise Built

    monkeypatch.setattr(Trainer, "train", stop)
    fetch("pickscore")
    _, requested = served
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # from the cache only
    with pytest.raises(Built):
        main(["train", "--quiet", *tiny_overrides, "data.prompts=pickscore", JPEG])
    assert seen["train"] == _lines("pickscore", "train.txt")
    assert seen["eval"] == _lines("pickscore", "test.txt")
    assert len(requested) == 2  # the fetch above; the run read the cache


def test_cli_prompts_fetch_and_list(served, capsys):
    from digenrl.tools.cli import main

    _, requested = served
    assert main(["prompts", "fetch", "geneval", "--split", "test"]) == 0
    assert str(cache_path(PROMPT_SETS["geneval"], "test")) in capsys.readouterr().out
    assert main(["prompts", "fetch", "geneval"]) == 0 and len(requested) == 2  # test was cached
    assert main(["prompts", "list"]) == 0
    out = capsys.readouterr().out
    assert "geneval:train  cached" in out and "pickscore:train  not fetched" in out and "MIT" in out
    assert main(["prompts", "fetch", "drawbench", "--split", "train"]) == 2
    assert "drawbench has no split 'train'" in capsys.readouterr().err
    assert main(["prompts", "fetch", "laion"]) == 2
    assert "named sets: pickscore, ocr, geneval, drawbench" in capsys.readouterr().err
