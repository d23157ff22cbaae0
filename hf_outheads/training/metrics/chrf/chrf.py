"""chrF and chrF++ with sacrebleu, as an offline `evaluate` module (Popovic 2015, 2017)."""

import datasets
import evaluate
import sacrebleu

CITATION = """@inproceedings{popovic-2015-chrf,
  title = "chr{F}: character n-gram {F}-score for automatic {MT} evaluation",
  author = "Popovi{\\'c}, Maja",
  booktitle = "Proceedings of the Tenth Workshop on Statistical Machine Translation",
  year = "2015",
  pages = "392--395",
}"""
FEATURES = [
    datasets.Features({"predictions": datasets.Value("string"), "references": datasets.Sequence(datasets.Value("string"))}),
    datasets.Features({"predictions": datasets.Value("string"), "references": datasets.Value("string")}),
]


class Chrf(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description="Corpus chrF (0-100) computed by sacrebleu.corpus_chrf; word_order=2 gives chrF++.",
            citation=CITATION,
            inputs_description="predictions: list of str; references: list of str or list of list of str. "
            "Keyword arguments (char_order, word_order, beta, lowercase, whitespace) go to sacrebleu.CHRF.",
            features=FEATURES,
        )

    def _compute(self, predictions, references, **kwargs):
        references = [[r] if isinstance(r, str) else list(r) for r in references]
        if len({len(r) for r in references}) > 1:
            raise ValueError("Every prediction needs the same number of references.")
        result = sacrebleu.CHRF(**kwargs).corpus_score(predictions, [list(s) for s in zip(*references)])
        return {"score": result.score, "char_order": result.char_order, "word_order": result.word_order, "beta": result.beta}
