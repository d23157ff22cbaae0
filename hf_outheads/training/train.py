"""Train an hf_outheads model (causal LM or seq2seq) with accelerate, evaluate it and publish it.

The head is part of the model config (`head_type`, `head_options`): nothing here depends on which
head it is. The run itself is `hf_outheads/training/run.py`'s; this command reads and checks its options first,
so that `--help` and a wrong option answer before torch is imported.

examples:
  hf-outheads train --config hf_outheads/training/configs/quickstart_lm.yaml [--key value ...]
  accelerate launch hf_outheads/training/train.py --config hf_outheads/training/configs/quickstart_lm.yaml [--key value ...]
"""

from __future__ import annotations

from hf_outheads.training.launching import refusal
from hf_outheads.training.options import RunOptions, parse_options


def parse_args(argv=None):
    """The options, checked before any work starts (`preflight.check_run`); a wrong option is
    one message on stderr and exit status 2, without a traceback."""
    try:
        options = parse_options(argv, description=__doc__)
        from hf_outheads.training.preflight import check_run  # (after the parse: it imports torch)

        check_run(options)
    except ValueError as error:
        raise refusal(error) from None
    return options


def main(argv=None, options: RunOptions | None = None, in_process: bool = False):
    """Train with `options` (default: parsed from `argv`); a run that cannot go on ends with one message.
    `in_process`: this process trains more than once (`run.train_in_process`)."""
    options = options or parse_args(argv)
    from hf_outheads.training.batches import BatchError  # (after the parse: these import torch)
    from hf_outheads.training.publish import PushFailed
    from hf_outheads.training.run import InputError, train_in_process, training_function
    from hf_outheads.training.safeguards import EarlierWork, NonFiniteError, OutputDirInUse

    try:
        (train_in_process if in_process else training_function)(options)
    except (NonFiniteError, BatchError, PushFailed) as error:  # found while training or pushing, said in full: no traceback
        raise refusal(error, status=1) from None
    except (OutputDirInUse, EarlierWork, InputError) as error:
        raise refusal(error) from None


if __name__ == "__main__":
    main()
