"""One row per registered head: the options the shared contract tests build it with
(tiny sizes; tests/tiny.py backbones have hidden 32, 2 layers, vocab 99).
A new head joins every contract test by adding its row here."""

HEAD_CASES = {
    "linear": {},
    "tied": {},
    "bilinear": {},
    "joint": {"joint_dim": 16},
    "drill": {"depth": 2},
    "mos": {"num_components": 3, "latent_dropout": 0.1},
    "doc": {"components": [[-1, 2], [1, 1], [0, 1]], "latent_dropout": 0.1},
    # 8 exclusive codes + an 8 x 16 table for 99 words: 37 empty cells, two empty rows
    "sigsoftmax": {},
    "lightrnn": {"num_components": 2, "num_exclusive": 8, "num_rows": 8, "num_columns": 16, "latent_dropout": 0.1},
}
