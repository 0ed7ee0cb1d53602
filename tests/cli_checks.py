"""What a command-line entry point did when its main() ran under pytest's capsys: its exit status
and output, and what it left on disk."""

import hashlib
import os


def run_cli(module, argv, capsys):
    """(exit status, stdout, stderr) of a CLI's main()."""
    capsys.readouterr()  # only what the CLI prints
    try:
        module.main(argv)
        code = 0
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code, err, *phrases):
    assert code == 2, err
    assert err.startswith("bertjax: error:") and err.count("\n") == 1, err
    for phrase in phrases:
        assert phrase in err, err


def leftovers(parent):
    """Staging directories an interrupted export would leave."""
    return [name for name in os.listdir(parent) if ".tmp-" in name or ".old-" in name]


def snapshot(directory):
    digest = {}
    for root, _, files in os.walk(directory):
        for name in files:
            with open(os.path.join(root, name), "rb") as f:
                digest[os.path.relpath(os.path.join(root, name), directory)] = hashlib.sha1(
                    f.read()).hexdigest()
    return digest
