"""Corpus BLEU with sacrebleu, as an offline `evaluate` module (Post 2018, "A Call for
Clarity in Reporting BLEU Scores")."""

import datasets
import evaluate
import sacrebleu

CITATION = """@inproceedings{post-2018-call,
  title = "A Call for Clarity in Reporting {BLEU} Scores",
  author = "Post, Matt",
  booktitle = "Proceedings of the Third Conference on Machine Translation: Research Papers",
  year = "2018",
  pages = "186--191",
}"""
FEATURES = [
    datasets.Features({"predictions": datasets.Value("string"), "references": datasets.Sequence(datasets.Value("string"))}),
    datasets.Features({"predictions": datasets.Value("string"), "references": datasets.Value("string")}),
]


def by_reference_index(references):
    """sacrebleu wants one stream per reference index; each prediction needs as many references."""
    references = [[r] if isinstance(r, str) else list(r) for r in references]
    if len({len(r) for r in references}) > 1:
        raise ValueError("Every prediction needs the same number of references.")
    return [list(stream) for stream in zip(*references)]


class Sacrebleu(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description="Corpus BLEU (0-100) computed by sacrebleu.corpus_bleu.",
            citation=CITATION,
            inputs_description="predictions: list of str; references: list of str or list of list of str. "
            "Keyword arguments (tokenize, lowercase, smooth_method, ...) go to sacrebleu.corpus_bleu.",
            features=FEATURES,
        )

    def _compute(self, predictions, references, **kwargs):
        result = sacrebleu.corpus_bleu(predictions, by_reference_index(references), **kwargs)
        return {"score": result.score, "counts": result.counts, "totals": result.totals,
                "precisions": result.precisions, "bp": result.bp, "sys_len": result.sys_len, "ref_len": result.ref_len}
