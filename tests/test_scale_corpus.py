"""The scale comparison's corpus (hf_outheads/training/corpora/debian_docs.py): each source format's text
extraction, and the tokenise-and-pack step at a small size (the ids round-trip to the
documents joined with </s>, the split is stable, a corrupted file is refused)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from hf_outheads.training.corpora import debian_docs
from hf_outheads.training.corpora.debian_docs import html_to_text, is_validation, load_blocks, pack, pod_to_text


def test_html_keeps_the_text_and_drops_scripts_and_navigation():
    page = ("<html><head><title>T</title><style>p {}</style></head><body>"
            "<div class='navheader'>Prev Up Next</div><h1>Title</h1><p>One <b>bold</b>\n word.</p>"
            "<script>var x = 1;</script><pre>a  b\n  c</pre><ul><li>item</li></ul></body></html>")
    assert html_to_text(page) == "Title\nOne bold word.\na  b\n  c\nitem"


def test_pod_resolves_formatting_codes_and_drops_commands():
    pod = "=pod\n\n=head1 NAME\n\nB<perl> - the C<< $x->y >> and L<perlfunc|perlfunc/open> I<here>\n\n=cut\n"
    assert pod_to_text(pod) == "NAME\n\nperl - the $x->y and perlfunc here"


def test_no_reserved_source():
    """WordNet and the gettext catalogs are reserved for independent evaluation (the data rule),
    and the Debian Administrator's Handbook is the held-out text of hf_outheads/training/corpora/debian_handbook.py."""
    reserved = ["./usr/share/locale/fr/LC_MESSAGES/dpkg.mo", "./usr/share/doc/x/po/fr.po",
                "./usr/share/wordnet/data.noun", "./usr/share/doc/x/LC_MESSAGES/x.po"]
    for name, (pattern, _) in debian_docs.PACKAGES.items():
        assert "wordnet" not in name and "handbook" not in name, name
        assert not [path for path in reserved if re.search(pattern, path)], (name, pattern)


def documents(count=60):
    words = "the output layer of a language model scores every word of the vocabulary".split()
    rng = np.random.default_rng(0)
    return [(f"doc{i}", " ".join(rng.choice(words, size=40 + i))) for i in range(count)]


def test_pack_round_trips_to_the_documents(tmp_path):
    docs = documents()
    info = pack(docs, tmp_path, vocab_size=300, block_size=16, validation_percent=20)
    assert info["vocab_size"] == 300 and info["block_size"] == 16
    from hf_outheads.tools.saved_tokenizer import load_tokenizer

    tokenizer = load_tokenizer(str(tmp_path), auto=False)
    for split in ("train", "validation"):
        blocks = load_blocks(tmp_path, split)
        assert blocks.dtype == np.dtype("<u2") and blocks.shape == (info["splits"][split]["blocks"], 16)
        texts = [text for name, text in docs if is_validation(name, 20) == (split == "validation")]
        assert info["splits"][split]["documents"] == len(texts) > 0
        joined = "".join(text + "</s>" for text in texts)
        decoded = tokenizer.decode(blocks.ravel().tolist())
        assert joined.startswith(decoded) and len(joined) - len(decoded) < 16 * 20  # only the last partial block is cut
    assert json.loads((tmp_path / "corpus.json").read_text())["splits"]["train"]["tokens"] == info["splits"]["train"]["tokens"]


def test_the_split_is_stable_and_a_changed_file_is_refused(tmp_path):
    assert [is_validation(f"doc{i}", 20) for i in range(50)] == [is_validation(f"doc{i}", 20) for i in range(50)]
    assert 0 < sum(is_validation(f"doc{i}", 20) for i in range(200)) < 80
    pack(documents(), tmp_path, vocab_size=300, block_size=16, validation_percent=20)
    path = tmp_path / "validation.u16.xz"
    path.write_bytes(path.read_bytes()[:-1] + b"\0")
    with pytest.raises(ValueError, match="checksum"):
        load_blocks(tmp_path, "validation")
    with pytest.raises(ValueError, match="both splits"):
        pack(documents(3)[:1], tmp_path / "one", vocab_size=300, validation_percent=0)


@pytest.mark.downloads("Debian's maint-guide package, with apt-get download")
def test_a_debian_package_builds(tmp_path):
    """The real path at a small size: one documentation package from the archive."""
    try:
        docs = list(debian_docs.package_documents(("maint-guide",), cache=tmp_path / "debs"))
    except RuntimeError as error:
        pytest.skip(f"apt-get download is not available here: {error}")
    assert len(docs) == 1 and "Debian" in docs[0][1] and len(docs[0][1]) > 100_000
