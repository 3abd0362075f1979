"""The world of an episode: the three app deciders composed.

``decide`` routes a validated tool call to its app, handing each app the facts it needs from
the others inside the command; ``EVOLVERS`` maps every app event type to (app index, evolve).
"""

from __future__ import annotations

from typing import NamedTuple

from domain import approvalflow, datahub, ticketdesk
from domain.outcomes import review, routing_problem
from domain.rules import rules_of

# Building a NamedTuple through its class runs a Python-level __new__; on the hot path we call
# tuple.__new__ directly, which builds the same value in C (fields in declaration order).
_new = tuple.__new__


class World(NamedTuple):
    ticketdesk: ticketdesk.TicketDeskState
    datahub: datahub.DataHubState
    approvalflow: approvalflow.ApprovalFlowState


INITIAL_WORLD = World(ticketdesk.initial_state, datahub.initial_state,
                      approvalflow.initial_state)

# event type -> (index in World, the app's evolve function for it)
EVOLVERS: dict[type, tuple[int, object]] = {
    **{t: (0, f) for t, f in ticketdesk.EVOLVERS.items()},
    **{t: (1, f) for t, f in datahub.EVOLVERS.items()},
    **{t: (2, f) for t, f in approvalflow.EVOLVERS.items()},
}


def evolve(world: World, event) -> World:
    """The world after one app event: the one place an event is routed to its app."""
    i, fn = EVOLVERS[type(event)]
    if i == 0:
        return _new(World, (fn(world.ticketdesk, event), world.datahub, world.approvalflow))
    if i == 1:
        return _new(World, (world.ticketdesk, fn(world.datahub, event), world.approvalflow))
    return _new(World, (world.ticketdesk, world.datahub, fn(world.approvalflow, event)))


def evolve_all(world: World, events) -> World:
    """The world after the app events among `events`; other events leave it as it is."""
    for event in events:
        if type(event) in EVOLVERS:
            world = evolve(world, event)
    return world


def decide(world: World, app: str, method: str, params: dict, step: int, target: dict) -> list:
    """The events of one validated tool call (effects or an ActionRejected)."""
    if app == "ticketdesk":
        return ticketdesk.decide(world.ticketdesk, _new(ticketdesk.Command, (
            method, params, step, world.approvalflow.approvals)))
    if app == "datahub":
        return datahub.decide(world.datahub, _new(datahub.Command, (method, params, step,
                                                                    rules_of(target) >= 3)))
    if method != "submit_approval":
        return approvalflow.decide(world.approvalflow,
                                   _new(approvalflow.Command,
                                        (method, params, step, None, (), None)))
    dh = world.datahub
    approver = datahub.approver_by_name(dh, params["approver"].strip())
    atype = world.approvalflow.types.get(params["approval_type"])
    chain = tuple(datahub.delegation_chain(dh, atype["approver_role"])) if atype else ()
    problems = review(target, world, params["approval_type"], params["data"])
    if approver is not None and (routed := routing_problem(target, world, params["approval_type"],
                                                           approver, chain)):
        problems = [*problems, routed]
    return approvalflow.decide(world.approvalflow, _new(approvalflow.Command, (
        method, params, step, approver, chain, problems)))


_RESULTS = {"ticketdesk": (0, ticketdesk.result), "datahub": (1, datahub.result),
            "approvalflow": (2, approvalflow.result)}


def result(world: World, app: str, method: str, params: dict, effects: list):
    """(result, message) of a successful call, from the world before it and its effects."""
    i, fn = _RESULTS[app]
    return fn(method, world[i], params, effects)


def views(world: World) -> dict:
    return {"ticketdesk": ticketdesk.view(world.ticketdesk),
            "datahub": datahub.view(world.datahub),
            "approvalflow": approvalflow.view(world.approvalflow)}
