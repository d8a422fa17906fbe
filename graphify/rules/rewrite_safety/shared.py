"""What the rewrite-safety rules share: where in the loop body's order a node runs."""

import libcst as cst


def statement_position(ck, node: cst.CSTNode, site) -> int:
    """Where the node runs in the loop body: the position of its statement line, or of the body's call
    that leads to it when it sits in a called function."""
    call = ck.region.body_call_of(site)
    if call is not None:
        node, site = call, ck.region.nodes[ck.position(call)][1]
    line = next((a for a in reversed(site.ancestors) if isinstance(a, cst.SimpleStatementLine)), node)
    return ck.position(line)


def after_first_gpu_work(ck, node: cst.CSTNode, site) -> bool:
    """After the statement that starts the step's GPU work (not in it: arguments of the first model call
    are its inputs)."""
    if ck.first_gpu_position >= len(ck.region.nodes):
        return False
    first, first_site = ck.region.nodes[ck.first_gpu_position]
    here, start = statement_position(ck, node, site), statement_position(ck, first, first_site)
    if here != start or site.block is ck.region.body_block or any(a is first for a in site.ancestors):
        return here > start
    # in a function the body's statement calls, after the model call there (not in its arguments)
    return ck.execution_order(ck.position(node)) > ck.execution_order(ck.first_gpu_position)
