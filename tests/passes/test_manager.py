"""Pass manager: ordering by constraints, clear errors, per-pass validation."""

from __future__ import annotations

import pytest
import torch
import torch.fx as fx

from rewrite.passes.manager import PassContext, PassError, PassManager, PassResult, PassSpec


def tiny_graph() -> fx.GraphModule:
    class Tiny(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x) + 1.0

    return torch.export.export(Tiny(), (torch.randn(2, 3),), strict=False).module()


def recorder(name: str, calls: list[str]):
    def run(gm, ctx):
        calls.append(name)
        return PassResult(gm, False, {"ran": name})

    run.__doc__ = f"Record that {name} ran; changes nothing."
    return run


def test_order_honours_after_and_before_and_keeps_declaration_order_otherwise():
    calls: list[str] = []
    specs = [
        PassSpec("fuse", recorder("fuse", calls), after=("canonicalize",)),
        PassSpec("verify", recorder("verify", calls), after=("fuse", "layout")),
        PassSpec("canonicalize", recorder("canonicalize", calls)),
        PassSpec("layout", recorder("layout", calls), after=("fuse",)),
        PassSpec("strip", recorder("strip", calls), before=("canonicalize",)),
    ]
    manager = PassManager(specs)
    assert manager.order == ("strip", "canonicalize", "fuse", "layout", "verify")
    ctx = PassContext(level="lossless")
    results = manager.run(tiny_graph(), ctx)
    assert calls == list(manager.order) == [name for name, _ in results]
    assert ctx.report["fuse"] == {"ran": "fuse"} and len(ctx.log) == 5


def test_cycle_is_an_error_that_shows_the_cycle():
    calls: list[str] = []
    specs = [PassSpec("a", recorder("a", calls), after=("b",)), PassSpec("b", recorder("b", calls), after=("a",))]
    with pytest.raises(ValueError, match=r"cycle: (a -> b -> a|b -> a -> b)"):
        PassManager(specs)


def test_constraint_naming_an_unknown_pass_is_an_error():
    with pytest.raises(ValueError, match="after='canonicalise'.*known: fuse"):
        PassManager([PassSpec("fuse", recorder("fuse", []), after=("canonicalise",))])


def test_a_pass_needs_a_docstring():
    with pytest.raises(ValueError, match="docstring"):
        PassSpec("anonymous", lambda gm, ctx: PassResult(gm, False))


def test_failing_pass_is_named_with_the_passes_already_run():
    def explode(gm, ctx):
        """Always fails."""
        raise RuntimeError("boom")

    calls: list[str] = []
    manager = PassManager([PassSpec("first", recorder("first", calls)), PassSpec("explode", explode, after=("first",)),
                           PassSpec("never", recorder("never", calls), after=("explode",))])
    with pytest.raises(PassError, match=r"pass 'explode' failed \(after first\): RuntimeError: boom") as info:
        manager.run(tiny_graph(), PassContext())
    assert info.value.pass_name == "explode" and info.value.passes_run == ("first",)
    assert isinstance(info.value.__cause__, RuntimeError) and calls == ["first"]


def test_a_pass_that_breaks_the_graph_fails_lint():
    def dangle(gm, ctx):
        """Erases a node that is still used (invalid)."""
        relu = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.relu.default)
        add = next(iter(relu.users))
        add.args = (fx.Node(gm.graph, "ghost", "placeholder", "ghost", (), {}), *add.args[1:])
        return PassResult(gm, True)

    with pytest.raises(PassError, match="pass 'dangle' failed"):
        PassManager([PassSpec("dangle", dangle)]).run(tiny_graph(), PassContext())


def test_a_pass_that_leaves_a_node_without_val_is_reported():
    def add_untyped_node(gm, ctx):
        """Inserts a neg node and forgets its meta['val']."""
        relu = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.relu.default)
        with gm.graph.inserting_after(relu):
            neg = gm.graph.call_function(torch.ops.aten.neg.default, (relu,))
        relu.replace_all_uses_with(neg, delete_user_cb=lambda user: user is not neg)
        return PassResult(gm, True)

    calls: list[str] = []
    manager = PassManager([PassSpec("ok", recorder("ok", calls)), PassSpec("untyped", add_untyped_node)])
    with pytest.raises(PassError, match=r"pass 'untyped' failed \(after ok\).*without meta\['val'\]: neg"):
        manager.run(tiny_graph(), PassContext())


def test_unknown_level_in_context_is_rejected():
    with pytest.raises(ValueError, match="off, lossless, channels_last"):
        PassContext(level="fast")
