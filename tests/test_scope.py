"""Which notebook names a %%distributed_fit cell reads (pure: no kernel, no cluster)."""

from __future__ import annotations

import textwrap
import types

import pytest

from phalanx.fit.analysis._names_read import notebook_reads
from phalanx.fit.analysis._shipping import resolve_names


def reads(cell: str) -> set[str]:
    return notebook_reads(textwrap.dedent(cell))[0]


def binds(cell: str) -> set[str]:
    return notebook_reads(textwrap.dedent(cell))[1]


# -- module-level statements, in order ----------------------------------------------------------

def test_a_name_bound_by_with_as_before_its_use_is_not_read():
    cell = """
        with open(path) as f:
            data = f.read()
        print(f.closed, len(data))
    """
    assert reads(cell) == {"open", "path", "print", "len"}
    assert binds(cell) == {"f", "data"}


def test_import_as_binds_the_alias_and_import_dotted_binds_the_top_package():
    assert reads("import torch.backends.cudnn as cudnn\ncudnn.benchmark = True\n") == set()
    assert reads("import os.path\nprint(os.path.sep)\n") == {"print"}
    assert binds("import a.b.c\nimport a.b as c\nfrom m import x as y, z\n") == {"a", "c", "y", "z"}


def test_a_star_import_binds_nothing_and_does_not_fail():
    assert reads("from math import *\nprint(sqrt(2))\n") == {"print", "sqrt"}
    assert binds("from math import *\n") == set()


def test_a_loop_body_reading_what_it_binds_later_reads_the_notebook():
    cell = """
        for i in range(3):
            total = total + i
    """
    assert reads(cell) == {"range", "total"}
    assert reads("total = 0\nfor i in range(3):\n    total = total + i\n") == {"range"}


def test_a_loop_binds_nothing_definite_after_it_zero_iterations():
    cell = """
        for batch in loader:
            last = batch
        print(last, batch)
    """
    assert reads(cell) == {"loader", "print", "last", "batch"}
    assert reads("while more():\n    x = 1\nelse:\n    y = 2\nprint(x, y)\n") >= {"x", "y"}


def test_a_name_bound_in_one_branch_only_is_read_after_it():
    cell = """
        if resume:
            state = load()
        model.load_state_dict(state)
    """
    assert reads(cell) == {"resume", "load", "model", "state"}


def test_a_name_bound_in_every_branch_is_not_read_after_it():
    cell = """
        if big:
            width = 512
        elif medium:
            width = 256
        else:
            width = 64
        print(width)
    """
    assert reads(cell) == {"big", "medium", "print"}


def test_a_branch_that_raises_does_not_reach_the_code_after_it():
    cell = """
        if path:
            state = load(path)
        else:
            raise ValueError("no checkpoint")
        print(state)
    """
    assert "state" not in reads(cell)


def test_augmented_assignment_reads_first():
    assert reads("steps += 1\n") == {"steps"}
    assert reads("steps = 0\nsteps += 1\n") == set()
    assert reads("cfg.lr *= 0.5\n") == {"cfg"}


def test_an_annotation_with_a_value_binds_a_bare_one_does_not():
    assert reads("lr: float = 0.1\nprint(lr)\n") == {"float", "print"}
    assert reads("lr: float\nprint(lr)\n") == {"float", "print", "lr"}


def test_del_unbinds():
    assert reads("x = 1\ndel x\nprint(x)\n") == {"print", "x"}


def test_except_as_is_bound_in_its_handler_and_unbound_after_it():
    cell = """
        try:
            run()
        except ValueError as err:
            print(err)
        print(err)
    """
    assert reads(cell) == {"run", "ValueError", "print", "err"}
    assert "err" not in reads("try:\n    run()\nexcept ValueError as err:\n    print(err)\n")


def test_try_paths_bind_what_both_the_body_and_each_handler_bind():
    fallback = """
        try:
            import apex
        except ImportError:
            apex = None
        print(apex)
    """
    assert reads(fallback) == {"ImportError", "print"}
    one_path = """
        try:
            ckpt = load()
        except FileNotFoundError:
            pass
        print(ckpt)
    """
    assert "ckpt" in reads(one_path)
    handler_sees_before = """
        try:
            opt = make()
        except RuntimeError:
            print(opt)
    """
    assert "opt" in reads(handler_sees_before)  # the body may fail before binding it
    with_finally = """
        try:
            a = 1
        finally:
            print(a)
            b = 2
        print(a, b)
    """
    assert reads(with_finally) == {"print", "a"}  # finally may run after a failure; after: both


def test_walrus_binds_at_module_level_even_inside_a_comprehension():
    assert reads("if (n := count()) > 2:\n    print(n)\nprint(n)\n") == {"count", "print"}
    cell = "hits = [y for x in xs if (y := score(x)) > 0]\nprint(y)\n"
    assert binds(cell) == {"hits", "y"}
    assert reads(cell) == {"xs", "score", "print", "y"}  # no x: y not definite after the loop


def test_a_comprehension_variable_shadows_the_notebook_name():
    cell = "squares = [x * x for x in xs]\nlabels = {k: v for k, v in pairs if k != x0}\n"
    assert reads(cell) == {"xs", "pairs", "x0"}
    assert "x" not in binds(cell)  # comprehension targets are local to it


def test_a_comprehension_reads_the_enclosing_names_at_that_point():
    assert reads("scale = 2\nys = [x * scale for x in xs]\n") == {"xs"}
    assert reads("ys = [x * scale for x in xs]\nscale = 2\n") == {"xs", "scale"}
    assert reads("pairs = [(a, b) for a in rows for b in a]\n") == {"rows"}


def test_match_captures_bind():
    cell = """
        match command:
            case ["fit", *rest]:
                print(rest)
            case {"lr": lr, **others}:
                print(lr, others)
            case Config(epochs=n) as cfg:
                print(n, cfg)
    """
    assert reads(cell) == {"command", "print", "Config"}
    assert binds(cell) == {"rest", "lr", "others", "n", "cfg"}
    assert "lr" in reads("match c:\n    case {'lr': lr}:\n        pass\nprint(lr)\n")
    assert "v" not in reads("match c:\n    case [v]:\n        pass\n    case v:\n        pass\nprint(v)\n")


def test_global_and_nonlocal_at_module_level_are_ignored():
    assert reads("global x\nx = 1\nprint(x)\n") == {"print"}


# -- functions, lambdas, classes ----------------------------------------------------------------

def test_a_parameter_shadows_the_notebook_name():
    cell = """
        def step(model, batch, lr=base_lr):
            out = model(batch)
            return out * lr
    """
    assert reads(cell) == {"base_lr"}  # the default is read where the function is defined


def test_a_functions_locals_are_decided_by_its_whole_body():
    cell = """
        def f():
            print(loss)
            for loss in losses():
                pass
    """
    assert reads(cell) == {"print", "losses"}  # loss is local to f (an UnboundLocalError)


def test_a_function_reading_a_global_the_cell_binds_later_does_not_ship_it():
    cell = """
        def train():
            return model(X)
        model = Net()
        train()
    """
    assert reads(cell) == {"Net", "X"}


def test_a_functions_globals_the_cell_never_binds_are_read():
    assert reads("def train():\n    return model(X)\n") == {"model", "X"}


def test_a_global_declaration_with_an_assignment_binds_at_module_level():
    cell = """
        def setup():
            global model
            model = Net()
        setup()
        print(model)
    """
    assert binds(cell) == {"setup", "model"}
    assert "Net" in reads(cell)


def test_a_closure_reads_its_enclosing_functions_names_not_the_notebook():
    cell = """
        def make(scale):
            offset = 1
            def inner(x):
                return x * scale + offset + bias
            return inner
    """
    assert reads(cell) == {"bias"}


def test_a_lambda_is_a_function():
    assert reads("key = lambda row, d=default: row[col] + d\n") == {"default", "col"}
    assert reads("col = 3\nkey = lambda row: row[col]\n") == set()


def test_decorators_and_annotations_are_read_where_the_function_is_defined():
    cell = """
        @torch.no_grad()
        def evaluate(m: Module) -> Tensor:
            return m(X_val)
    """
    assert reads(cell) == {"torch", "Module", "Tensor", "X_val"}
    lazy = "from __future__ import annotations\ndef f(m: Module) -> Tensor:\n    return m\n"
    assert reads(lazy) == set()


def test_a_class_body_runs_at_definition_and_its_names_are_not_seen_by_its_methods():
    cell = """
        class Net(nn.Module):
            width = 64
            depth = width // 16
            def forward(self, x):
                return x * width
        net = Net()
    """
    # ``width`` in forward is a global read (methods skip the class body): the notebook's
    assert reads(cell) == {"nn", "width"}
    assert binds(cell) == {"Net", "net"}


def test_a_class_body_reads_module_names_bound_before_it():
    cell = """
        hidden = 32
        class Head:
            size = hidden * 2
            sizes = [size for _ in range(2)]
    """
    assert reads(cell) == {"range", "size"}  # a class-body comprehension skips the class names


def test_a_comprehension_in_a_function_sees_the_functions_names():
    cell = """
        def shard(rows, n):
            return [rows[i::n] for i in range(n) if i < limit]
    """
    assert reads(cell) == {"range", "limit"}


def test_a_walrus_in_a_comprehension_in_a_function_binds_the_function():
    cell = """
        def f(xs):
            found = [y for x in xs if (y := g(x))]
            return y
    """
    assert reads(cell) == {"g"}


def test_a_class_in_a_function_hides_its_names_from_its_methods():
    cell = """
        def build(k):
            class Layer:
                size = k
                def forward(self):
                    return size + k
            return Layer
    """
    assert reads(cell) == {"size"}


# -- through resolve_names ---------------------------------------------------------------------

def test_a_closed_file_left_by_an_earlier_cell_is_not_shipped_when_the_cell_reopens_it(tmp_path):
    path = tmp_path / "data.txt"
    path.write_text("1 2 3")
    with open(path) as f:  # an earlier cell's file, closed now
        pass
    cell = "with open(path) as f:\n    data = f.read().split()\nn = len(data)\n"
    assert resolve_names(cell, {"f": f, "path": path, "data": [1]}) == {"path": path}


def test_a_module_object_is_not_shipped_when_the_cell_imports_it_first():
    cudnn = types.ModuleType("torch.backends.cudnn")
    cell = "import torch.backends.cudnn as cudnn\ncudnn.benchmark = True\nprint(seed)\n"
    assert resolve_names(cell, {"cudnn": cudnn, "seed": 3}) == {"seed": 3}


def test_a_notebook_name_read_before_the_cell_binds_it_is_shipped():
    assert resolve_names("for i in range(3):\n    total = total + i\n", {"total": 10}) == {"total": 10}


def test_a_name_the_cell_binds_somewhere_is_not_missing_though_the_notebook_lacks_it():
    assert resolve_names("if flag:\n    x = 1\nprint(x)\n", {"flag": True}) == {"flag": True}
    assert resolve_names("def f():\n    return helper()\ndef helper():\n    return 1\n", {}) == {}


def test_a_name_defined_nowhere_is_still_a_clear_name_error():
    with pytest.raises(NameError, match=r"the cell uses 'no_such_thing', which is not defined in "
                                        r"the notebook"):
        resolve_names("x = 1\nprint(x + no_such_thing)\n", {})


def test_injected_and_builtin_names_are_neither_shipped_nor_missing():
    assert resolve_names("print(rank, len(xs))\n", {"xs": [1]}, injected={"rank"}) == {"xs": [1]}


def test_a_function_naming_an_undefined_global_is_not_refused_until_it_runs():
    """As in Python: a class pasted whole (a model file) may name classes of branches the cell
    never takes; only a name read as the cell runs must exist."""
    body = ("class Model:\n    def build(self, kind):\n        if kind == 'other':\n"
            "            return Missing()\n        return 1\nm = Model().build('lstm')\n")
    assert resolve_names(body, {}) == {}
    with pytest.raises(NameError, match="'Missing'"):
        resolve_names("x = Missing()\n", {})
