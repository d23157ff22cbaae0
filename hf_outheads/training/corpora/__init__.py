"""The corpora built here, with no Hub: the Python standard library's docstrings (`stdlib`, the
quickstart's offline corpus), the Linux man-pages (`manpages`) and their translations
(`manpages_l10n`), Debian's English documentation packed for the scale study (`debian_docs`), and
the held-out text of The Debian Administrator's Handbook (`debian_handbook`). Those from Debian's
package archive share its download and unpacking (`debian`). `train.py` reads the first three by
`dataset_name` (`hf_outheads.training.data.BUILT_CORPORA`)."""
