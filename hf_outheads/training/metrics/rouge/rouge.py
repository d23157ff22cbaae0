"""ROUGE-1/2/L/Lsum F-measures with Google's `rouge_score`, as an offline `evaluate` module
(Lin 2004). Scores are averaged over examples; with several references the best one counts."""

import datasets
import evaluate

CITATION = """@inproceedings{lin-2004-rouge,
  title = "{ROUGE}: A Package for Automatic Evaluation of Summaries",
  author = "Lin, Chin-Yew",
  booktitle = "Text Summarization Branches Out",
  year = "2004",
  pages = "74--81",
}"""
FEATURES = [
    datasets.Features({"predictions": datasets.Value("string"), "references": datasets.Sequence(datasets.Value("string"))}),
    datasets.Features({"predictions": datasets.Value("string"), "references": datasets.Value("string")}),
]


class Rouge(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description="Mean ROUGE F-measures (0-1) computed by rouge_score.",
            citation=CITATION,
            inputs_description="predictions: list of str; references: list of str or list of list of str; "
            "rouge_types (default rouge1, rouge2, rougeL, rougeLsum), use_stemmer (default False).",
            features=FEATURES,
        )

    def _compute(self, predictions, references, rouge_types=("rouge1", "rouge2", "rougeL", "rougeLsum"), use_stemmer=False):
        try:
            from rouge_score import rouge_scorer
        except ImportError as error:
            raise ImportError("ROUGE needs the rouge-score package: pip install 'hf_outheads[train]'.") from error
        scorer = rouge_scorer.RougeScorer(list(rouge_types), use_stemmer=use_stemmer)
        totals = dict.fromkeys(rouge_types, 0.0)
        for prediction, refs in zip(predictions, references):
            refs = [refs] if isinstance(refs, str) else refs
            scores = scorer.score_multi(refs, prediction)
            for kind in rouge_types:
                totals[kind] += scores[kind].fmeasure
        return {kind: total / max(len(predictions), 1) for kind, total in totals.items()}
