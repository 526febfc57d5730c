"""The named prompt sets: where each split's file lives, its checksums, license and citation.

Every file comes from flow_grpo's dataset/ folder at one pinned commit (the folder that
DiffusionNFT and Flow-Factory copy). No Hugging Face hub dataset repo was found that hosts
these exact files, so the source is GitHub's raw file server; DiffusionNFT's copy, whose
git blob ids are identical, is the second URL tried.

Checksums: `git_sha1` is the git blob id in the pinned tree (sha1 of b"blob <size>\\0" +
content), known for every file; `sha256` is computed from a stored copy of the blob where
one was at hand (`git show <commit>:<path> | sha256sum`) and None where the blob was
absent from every stored snapshot (geneval and ocr train). Each recorded digest is checked
after a download and on every load.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

FLOW_GRPO = "yifan123/flow_grpo"
# "add drawbench prompt" (2025-07-21): the first commit with all four sets' files
FLOW_GRPO_COMMIT = "f1f91a2edbfdc3d03185a931a9b4969929a82da3"
DIFFUSION_NFT = "NVlabs/DiffusionNFT"
DIFFUSION_NFT_COMMIT = "24af5554898d85e93efa492f42b5e9cdf4156e9b"  # same blobs under dataset/
FLOW_GRPO_LICENSE = "MIT (flow_grpo repository)"
FLOW_GRPO_CITATION = "Liu et al., Flow-GRPO: Training Flow Matching Models via Online RL, arXiv:2505.05470 (2025)"

SPLITS = ("train", "test")
FORMATS = ("lines", "geneval-jsonl")  # one prompt per line | one JSON object per line, "prompt" key


@dataclass(frozen=True)
class PromptFile:
    """One split's file: its path in the source repos and the digests it must have."""

    path: str  # e.g. "dataset/pickscore/train.txt"
    git_sha1: str
    sha256: Optional[str]
    size: Optional[int] = None  # bytes, where known (progress bar total; a quick sanity check)

    def urls(self) -> tuple[str, ...]:
        """Where to download it, in the order tried."""
        return tuple(f"https://raw.githubusercontent.com/{repo}/{commit}/{self.path}"
                     for repo, commit in ((FLOW_GRPO, FLOW_GRPO_COMMIT), (DIFFUSION_NFT, DIFFUSION_NFT_COMMIT)))

    @property
    def filename(self) -> str:
        return self.path.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class PromptSet:
    """A named prompt set: per split a file, how to read it, and where it came from."""

    name: str
    description: str
    splits: dict[str, PromptFile]
    format: str = "lines"
    revision: str = FLOW_GRPO_COMMIT  # the cache folder's name: a new pin is a new folder
    license: str = FLOW_GRPO_LICENSE
    upstream_license: str = "unknown"  # of the prompts' original source, where it differs
    citation: tuple[str, ...] = field(default=(FLOW_GRPO_CITATION,))
    note: str = ""

    @property
    def source(self) -> str:
        """The folder the files come from, at the pinned commit (for docs and messages)."""
        folder = next(iter(self.splits.values())).path.rsplit("/", 1)[0]
        return f"https://github.com/{FLOW_GRPO}/tree/{FLOW_GRPO_COMMIT}/{folder}"


def _f(path: str, git_sha1: str, sha256: Optional[str], size: Optional[int]) -> PromptFile:
    return PromptFile(f"dataset/{path}", git_sha1, sha256, size)


PROMPT_SETS: dict[str, PromptSet] = {
    s.name: s
    for s in [
        PromptSet(
            "pickscore",
            "Pick-a-Pic v1 captions with at least 6 words, deduplicated, shuffled (flow_grpo "
            "dataset/pickscore/prpocess.py): train 25,432, test 2,048",
            {
                "train": _f("pickscore/train.txt", "a437bd921c03fbc00c4e7ce148ae2d28fcd6e49b",
                            "2f425adcbb9a6d0feee7c6c448e1cb83a1f71deca9434b803907e2578eca837f", 2906730),
                "test": _f("pickscore/test.txt", "45f05231b969fb5f74c8debd606b22cd3be27f8e",
                           "d75c025fa451866e70f7e36243f7cdd93095523cb51f5f9651f2ce3236d20262", 239891),
            },
            upstream_license="unknown (Pick-a-Pic, yuvalkirstain/pickapic_v1 on the HF hub)",
            citation=(FLOW_GRPO_CITATION, "Kirstain et al., Pick-a-Pic: An Open Dataset of User Preferences "
                                          "for Text-to-Image Generation, arXiv:2305.01569 (2023)"),
        ),
        PromptSet(
            "ocr",
            "prompts that ask for rendered text in quotes (flow_grpo's OCR reward): test 1,018",
            {
                "train": _f("ocr/train.txt", "3ce0521b77b0a9031191d66ecc36ebaaf27a3922", None, None),
                "test": _f("ocr/test.txt", "8deb4f8d8f2e863f45353354243669b3c991a6a2",
                           "4dd8caf3ab6ade73bd376c7d14c6ca49b6eacfb1bd321e22c40714ae4a98d4dc", 217565),
            },
            upstream_license="MIT (written for flow_grpo)",
        ),
        PromptSet(
            "geneval",
            "GenEval-style compositional prompts with their detector metadata (tag, include, "
            "exclude): test 2,212 rows of 553 prompts",
            {
                "train": _f("geneval/train_metadata.jsonl", "0b97e8a6802c08fc7537cd00c76ae79c851bddcb", None, None),
                "test": _f("geneval/test_metadata.jsonl", "27cdaf5cc1356fe15aeadbb8df55682ca74228f0",
                           "cec4b24b9fee7bac21c8f787054ecc8dc9ff831674037713a4cd35e0f0a74a28", 340835),
            },
            format="geneval-jsonl",
            upstream_license="unknown (GenEval, djghosh13/geneval)",
            citation=(FLOW_GRPO_CITATION, "Ghosh, Hajishirzi, Schmidt, GenEval: An Object-Focused Framework "
                                          "for Evaluating Text-to-Image Alignment, arXiv:2310.11513 (2023)"),
        ),
        PromptSet(
            "drawbench",
            "DrawBench (Imagen's benchmark prompts): test 1,000 lines, 200 of them repeats",
            {
                "test": _f("drawbench/test.txt", "8d96e7cf7017ce6ce299a6eec96e21467a2ac7aa",
                           "9006b98feabb94b28a2bc0c88de42fd4f31a9ec3c2a19e308a02c5385b7172f0", 65164),
            },
            upstream_license="unknown (DrawBench, Imagen)",
            citation=(FLOW_GRPO_CITATION, "Saharia et al., Photorealistic Text-to-Image Diffusion Models with "
                                          "Deep Language Understanding (Imagen), arXiv:2205.11487 (2022)"),
            # flow_grpo's drawbench/train.txt is one prompt, a placeholder: not registered
            note="a benchmark; flow_grpo's drawbench/train.txt is a one-line placeholder",
        ),
    ]
}
