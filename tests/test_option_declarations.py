"""One way to declare an option: head and training options are dataclass fields declared
with `hf_outheads.head_options`' declarators, whose `Spec` holds the type, the range and the help.
A range changed in that one place is what every way in enforces: `hf-outheads train`'s flags, a
YAML config, `RunOptions.from_flat`, `OutHeadsConfig(...)` and `from_pretrained`."""

from __future__ import annotations

import dataclasses
import sys
import types

import pytest
import yaml

from hf_outheads import OutHeadsConfig
from hf_outheads.head_drill import DrillOptions
from hf_outheads.training.options import GROUPS, DataOptions, RunOptions, parse_options
from tiny import tiny_config


def declare(monkeypatch, options_class, name: str, **change) -> None:
    """Change the declaration of `options_class`'s option `name` (its `Spec`) for this test."""
    declared = options_class.__dataclass_fields__[name]
    spec = dataclasses.replace(declared.metadata["spec"], **change)
    monkeypatch.setattr(declared, "metadata", types.MappingProxyType({**declared.metadata, "spec": spec}))


def refused(argv: list[str], capsys, monkeypatch) -> str:
    """The one line `hf-outheads <argv>` refuses them with (exit status 2)."""
    from hf_outheads.tools.cli import main

    monkeypatch.setattr(sys, "argv", sys.argv[:1])
    capsys.readouterr()
    with pytest.raises(SystemExit) as error:
        main(argv)
    err = capsys.readouterr().err.strip()
    assert error.value.code == 2 and len(err.splitlines()) == 1, err
    return err


def test_a_range_changed_in_its_declaration_is_enforced_everywhere(tmp_path, monkeypatch, capsys):
    from hf_outheads import OutHeadsForCausalLM

    saved = tmp_path / "saved"
    OutHeadsForCausalLM(OutHeadsConfig(text_config=tiny_config("gpt2"), head_type="drill",
                                       head_options={"depth": 2})).save_pretrained(saved)  # valid when saved
    declare(monkeypatch, DrillOptions, "depth", low=3)  # a head option: depth >= 0 becomes >= 3
    declare(monkeypatch, DataOptions, "block_size", low=16)  # a training option: block_size >= 2 becomes >= 16

    head = "Head 'drill': option 'depth' must be an integer >= 3, got 2"
    assert head in refused(["train", "--head_type", "drill", "--head_options", "{depth: 2}"], capsys, monkeypatch)
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"head_type": "drill", "head_options": {"depth": 2}}))
    with pytest.raises(ValueError, match=head):
        parse_options(["--config", str(config)])
    with pytest.raises(ValueError, match=head):
        OutHeadsConfig(text_config=tiny_config("gpt2"), head_type="drill", head_options={"depth": 2})
    with pytest.raises(ValueError, match=head):
        OutHeadsForCausalLM.from_pretrained(saved)
    OutHeadsConfig(text_config=tiny_config("gpt2"), head_type="drill", head_options={"depth": 3})  # in the new range

    training = "Option block_size must be an integer >= 16, got 8"
    assert training in refused(["train", "--block-size", "8"], capsys, monkeypatch)
    config.write_text(yaml.safe_dump({"block_size": 8}))
    with pytest.raises(ValueError, match=training):
        parse_options(["--config", str(config)])
    with pytest.raises(ValueError, match=training):
        RunOptions.from_flat({"block_size": 8})
    assert RunOptions.from_flat({"block_size": 16}).data.block_size == 16


def test_the_command_lines_flags_are_the_declarations(capsys, monkeypatch):
    """`--help` lists every declared option, with its help and default, under its group."""
    from hf_outheads.tools.cli import main

    monkeypatch.setattr(sys, "argv", sys.argv[:1])
    with pytest.raises(SystemExit) as done:
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert done.value.code == 0
    for group, options_class in GROUPS.items():
        section = text[text.index(f"{group} options:"):]
        for name, spec in options_class.declarations().items():
            assert f"--{name}" in section and " ".join(spec.help.split()[:4]) in section, (group, name)


def test_yaml_numbers_are_numbers_however_written():
    """PyYAML reads `1e-3` as a string (YAML 1.1); a config and a flag read it as the number it is,
    and the one check refuses a string where a number is declared."""
    options = parse_options(["--learning_rate", "1e-3", "--adam_beta2", "9.5E-1"])
    assert (options.training.learning_rate, options.training.adam_beta2) == (0.001, 0.95)
    with pytest.raises(ValueError, match=r"Option learning_rate must be a number > 0, got '1e-3'"):
        RunOptions.from_flat({"learning_rate": "1e-3"})


def test_head_options_that_cannot_train_together_are_refused_when_parsed():
    """A combination of given head options that no backbone makes work (the z-loss with the sampled
    loss, a peer kernel without the z-loss) is refused when the run's options are parsed, also for a
    pretrained backbone, whose model is built only after the data is read."""
    for given, said in (("{z_loss: 1e-4, training_loss: sampled}", "'z_loss' needs the full log-normaliser"),
                        ("{z_loss: 1e-4, loss_kernel: cce}", "the loss kernel 'cce' takes no z_loss")):
        with pytest.raises(ValueError, match=said):
            parse_options(["--pretrained", "some/model", "--head_type", "linear", "--head_options", given])
