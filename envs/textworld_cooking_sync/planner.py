"""The planner oracle: the remaining commands that finish a set of dishes, for one agent or a team.

One agent (:func:`plan`). From the current state, simulated on a copy with the game's own rules (every planned
command is executed and must be valid), in the order of CookingWorld's walkthrough:

1. read the cookbook (if this agent has not);
2. eat any of its dishes that is already prepared;
3. fetch every missing ingredient, nearest first (by the moves its whole fetch takes from where the agent stands);
4. take the knife and cut what the recipes say; go to each heat source and cook what the recipes say;
5. in the kitchen, prepare and eat each dish.

Fetching (``get``) is recursive: an item in a locked container or behind a locked door first needs that lock's key,
fetched the same way (the generator guarantees the keys form no cycle); closed doors and containers are opened on
the way. Paths are breadth-first over the map's exits (fixed direction order); ingredients are fetched nearest first
by the moves their whole fetch takes (keys included), a metric that walking a route lowers by one a step, so
re-planning from any state along a plan continues it.

A team (:class:`TeamOracle`): dishes are split among agents by longest-processing-time (each dish's single-agent
plan length as its cost), and each agent re-plans its own dishes from the shared state before every command, so the
team adapts to whatever the others did. With per-agent inventories an item held by another agent blocks the plan
(:class:`Blocked`): the agent does the commands it can before it needs that item, then waits (``look``); and agents
put down whatever their plan does not need (``release``: keys once their lock is open or when the plan does not use
them, the knife once nothing is left to cut, the cookbook, other dishes' food), so nothing a waiting agent needs
stays held. Tested: every family and difficulty, 2 and 3 agents, both inventory readings, and three threads stepping
concurrently (tests/envs/test_textworld_cooking_sync.py); the benchmark runs the valid split.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterable

from envs.textworld_cooking_sync import rules
from envs.textworld_cooking_sync.data import CUT_VERB
from envs.textworld_cooking_sync.state import WorldState
from envs.textworld_cooking_sync.world import World

WAIT = "look"


class Unsolvable(Exception):
    """The dishes cannot be finished from this state (a dish failed, an ingredient is gone, a key is lost)."""


class Blocked(Exception):
    """An item the plan needs is held by another agent (per-agent inventories). ``commands`` holds the plan's
    commands up to that point (what the agent can already do)."""

    def __init__(self, item: str, commands: list[str] | None = None):
        super().__init__(item)
        self.item, self.commands = item, list(commands or [])


def sim_copy(state: WorldState) -> WorldState:
    """A deep copy without the agents' histories and the log (planning does not need them)."""
    agents = {k: dataclasses.replace(a, history=[]) for k, a in state.agents.items()}
    return copy.deepcopy(dataclasses.replace(state, agents=agents, log=[]))


def plan(state: WorldState, agent: str, dishes: Iterable[str] | None = None, *, release: bool = False) -> list[str]:
    """The commands that take ``agent`` from ``state`` to every dish in ``dishes`` (default: all) eaten.

    Raises :class:`Unsolvable` when that is impossible and :class:`Blocked` when another agent holds a needed item.
    Empty when the dishes are already eaten. ``release``: put down what the plan does not need (team play with
    per-agent inventories; module docstring).
    """
    if agent not in state.agents:
        raise KeyError(f"unknown agent {agent!r}; agents are {sorted(state.agents)}")
    names = [d.name for d in state.dishes] if dishes is None else list(dishes)
    unknown = [n for n in names if state.dish(n) is None]
    if unknown:
        raise ValueError(f"unknown dishes {unknown}; the world's dishes are {[d.name for d in state.dishes]}")
    keys = None
    if release:  # first pass: which keys does the plan use? (the others are put down at once)
        probe = _Planner(sim_copy(state), agent, release, keys=set(state.items))
        try:
            probe.run(names)
        except Blocked:
            pass
        keys = {c.rsplit(" with ", 1)[1] for c in probe.commands if c.startswith("unlock ")}
    p = _Planner(sim_copy(state), agent, release, keys=keys)
    try:
        p.run(names)
    except Blocked as e:
        raise Blocked(e.item, p.commands) from None
    return p.commands


def next_command(state: WorldState, agent: str, dishes: Iterable[str] | None = None, *, release: bool = False) -> str:
    """The first command of :func:`plan`; ``look`` when there is nothing to do, the plan is blocked or impossible."""
    try:
        commands = plan(state, agent, dishes, release=release)
    except Unsolvable:
        return WAIT
    except Blocked as e:
        commands = e.commands
    return commands[0] if commands else WAIT


class _Planner:
    def __init__(self, sim: WorldState, agent: str, release: bool, keys: set[str] | None = None):
        self.sim, self.agent, self.release = sim, agent, release
        self.keys = keys or set()  # release mode: the keys this plan will use (kept in hand)
        self.commands: list[str] = []
        self._getting: set[str] = set()
        self._hops: dict[str, dict[str, tuple[int, list[tuple[str, str | None]]]]] = {}

    @property
    def room(self) -> str:
        return self.sim.agents[self.agent].room

    def do(self, command: str) -> None:
        out = rules.execute(self.sim, self.agent, command)
        if not out.valid:  # a planner bug, never a property of the task
            raise AssertionError(f"planned command {command!r} is invalid here: {out.text}")
        self.commands.append(command)

    def holds(self, name: str) -> bool:
        return self.sim.holds(self.agent, name)

    # -- the plan ---------------------------------------------------------------------------------------------------
    def run(self, names: list[str]) -> None:
        sim = self.sim
        if sim.lost:
            raise Unsolvable(f"the world is lost: {sim.failed}")
        dishes = [sim.dish(n) for n in names if sim.dish(n).status != "eaten"]
        if self.release:
            self.drop_unneeded(dishes)
        if not dishes:
            return
        if not sim.agents[self.agent].read_cookbook:
            self.reach("cookbook")
            self.do("examine cookbook")
        for dish in dishes:
            if dish.status == "prepared":
                self.get(dish.name)
                self.do(f"eat {dish.name}")
        pending = [d for d in dishes if d.status == "pending"]
        needed = [(ing, sim.items[ing.food]) for d in pending for ing in d.ingredients]
        todo = [ing.food for ing, _ in needed if not self.holds(ing.food)]
        while todo:
            held = {i.name for i in sim.carried(self.agent)}
            food = min(todo, key=lambda f: (self.route_cost(self.room, f, set(held))[0], todo.index(f)))
            self.get(food)
            todo.remove(food)
        to_cut = [(ing, item) for ing, item in needed if ing.cutting != item.cutting]
        if to_cut:
            self.get("knife")
            for ing, _ in to_cut:
                self.do(f"{CUT_VERB[ing.cutting]} {ing.food} with knife")
            if self.release:
                self.do("drop knife")
        to_cook = [(ing, item) for ing, item in needed if ing.cooking != item.cooking]
        sources = {f.heat: f for f in sim.furniture.values() if f.heat}
        while to_cook:
            hops = self.hops(self.room)
            heat = min({ing.cooking for ing, _ in to_cook}, key=lambda h: (hops.get(sources[h].room, (1e9,))[0], h))
            self.goto(sources[heat].room)
            for ing, _ in [x for x in to_cook if x[0].cooking == heat]:
                self.do(f"cook {ing.food} with {sources[heat].name}")
            to_cook = [x for x in to_cook if x[0].cooking != heat]
        self.goto(sim.kitchen)
        for dish in pending:
            self.do(f"prepare {dish.name}")
            self.do(f"eat {dish.name}")

    def drop_unneeded(self, dishes) -> None:
        """Team play with own inventories: put down everything this agent's plan does not need, so that no other
        agent waits for it: keys the plan will not use, the knife once nothing needs cutting, the cookbook, other
        dishes' food."""
        sim = self.sim
        pending = [d for d in dishes if d.status == "pending"]
        food = {i.food for d in pending for i in d.ingredients} | {d.name for d in dishes if d.status == "prepared"}
        cut = any(sim.items[i.food].cutting != i.cutting for d in pending for i in d.ingredients)
        for item in sim.carried(self.agent):
            keep = (
                item.name in food
                or (item.kind == "knife" and cut)
                or (item.kind == "key" and item.name in self.keys and self._locked(item.opens))
            )
            if not keep:
                self.do(f"drop {item.name}")

    def _locked(self, name: str | None) -> bool:
        lock = self.sim.doors.get(name or "") or self.sim.furniture.get(name or "")
        return lock is not None and lock.state == "locked"

    # -- fetching ---------------------------------------------------------------------------------------------------
    def reach(self, name: str) -> None:
        """Stand where ``name`` can be used: carry it, or (the cookbook) be in its room with it visible."""
        item = self.sim.items[name]
        if self.holds(name):
            return
        if item.where[0] == "room" or item.where[0] == "on":
            self.goto(self.sim.room_of(item))
            return
        self.get(name)

    def get(self, name: str) -> None:
        """Carry ``name``: fetch its lock's key first if needed, walk there, open what is closed, take it."""
        sim = self.sim
        item = sim.items.get(name)
        if item is None or item.where == ("gone", ""):
            raise Unsolvable(f"the {name} is gone")
        if self.holds(name):
            return
        if item.where[0] == "held":
            raise Blocked(name)
        if name in self._getting:
            raise Unsolvable(f"fetching the {name} needs the {name} itself (a cycle of keys)")
        self._getting.add(name)
        try:
            kind, place = item.where
            container = sim.furniture[place] if kind == "in" else None
            if container is not None and container.state == "locked":
                self.get(container.key)
            self.goto(sim.room_of(item))
            if container is not None:
                if container.state == "locked":
                    self.do(f"unlock {place} with {container.key}")
                    if self.release:
                        self.do(f"drop {container.key}")
                if container.state == "closed":
                    self.do(f"open {place}")
            self.do(f"take {name}" if kind == "room" else f"take {name} from {place}")
        finally:
            self._getting.discard(name)

    # -- moving ---------------------------------------------------------------------------------------------------
    def hops(self, source: str) -> dict[str, tuple[int, list[tuple[str, str | None]]]]:
        """Breadth-first paths from ``source`` over the map's exits, whatever the doors' states (a closed door is
        opened on the way, a locked one needs its key first): room -> (hops, [(direction, door), ...]). Directions
        are tried in a fixed order, so paths are deterministic."""
        if source not in self._hops:
            out = {source: (0, [])}
            frontier = [source]
            while frontier:
                nxt_frontier = []
                for room in frontier:
                    r = self.sim.rooms[room]
                    for direction in sorted(r.exits):
                        nxt = r.exits[direction]
                        if nxt not in out:
                            out[nxt] = (out[room][0] + 1, out[room][1] + [(direction, r.doors.get(direction))])
                            nxt_frontier.append(nxt)
                frontier = nxt_frontier
            self._hops[source] = out
        return self._hops[source]

    def missing_key(self, path: list[tuple[str, str | None]], held: set[str]) -> str | None:
        for _, door_name in path:
            door = self.sim.doors.get(door_name or "")
            if door is not None and door.state == "locked" and door.key not in held:
                return door.key
        return None

    def route_cost(self, room: str, name: str, held: set[str], depth: int = 0) -> tuple[float, str]:
        """Moves and takes that :meth:`get` spends on ``name`` from ``room`` with ``held`` in hand (updated), and
        the room it ends in. Mirrors get/goto, so walking a route lowers its own cost by one a step and any other
        route's by at most one: re-planning on the way keeps the same target."""
        if name in held:
            return 0.0, room
        item = self.sim.items[name]
        if item.where[0] != "room" and item.where[0] not in ("on", "in") or depth > len(self.sim.items):
            return float("inf"), room
        cost = 0.0
        kind, place = item.where
        lock = self.sim.furniture[place] if kind == "in" else None
        if lock is not None and lock.state == "locked" and lock.key not in held:
            c, room = self.route_cost(room, lock.key, held, depth + 1)
            cost += c
        target = self.sim.room_of(item)
        while True:
            hops, path = self.hops(room).get(target, (None, None))
            if path is None:
                return float("inf"), room
            key = self.missing_key(path, held)
            if key is None:
                break
            c, room = self.route_cost(room, key, held, depth + 1)
            if c == float("inf"):
                return c, room
            cost += c
        held.add(name)
        return cost + hops + 1, target

    def goto(self, target: str) -> None:
        """Walk to ``target`` along the breadth-first path, opening (and, with a key, unlocking) doors; fetches the
        keys of locked doors on the path first."""
        for _ in range(len(self.sim.doors) + 2):
            if self.room == target:
                return
            _, path = self.hops(self.room).get(target, (None, None))
            if path is None:
                raise Unsolvable(f"no way from the {self.room} to the {target}")
            held = {i.name for i in self.sim.carried(self.agent)}
            key = self.missing_key(path, held)
            if key is not None:
                self.get(key)
                continue
            for direction, door_name in path:
                if door_name:
                    door = self.sim.doors[door_name]
                    if door.state == "locked":
                        self.do(f"unlock {door_name} with {door.key}")
                        if self.release:
                            self.do(f"drop {door.key}")
                    if door.state == "closed":
                        self.do(f"open {door_name}")
                self.do(f"go {direction}")
            return
        raise Unsolvable(f"cannot reach the {target}")


# -- team play ---------------------------------------------------------------------------------------------------------
def assign(state: WorldState, agents: list[str]) -> dict[str, list[str]]:
    """Dishes split among ``agents`` by longest processing time first: each dish's cost is the length of the first
    agent's plan for it alone; a dish goes to the agent with the least total cost so far."""
    if not agents:
        raise ValueError("assign() needs at least one agent")
    costs = {}
    for dish in state.dishes:
        try:
            costs[dish.name] = len(plan(state, agents[0], [dish.name]))
        except (Unsolvable, Blocked):
            costs[dish.name] = 0
    load = {a: 0 for a in agents}
    out: dict[str, list[str]] = {a: [] for a in agents}
    for name in sorted(costs, key=lambda n: (-costs[n], n)):
        a = min(agents, key=lambda a: (load[a], agents.index(a)))
        out[a].append(name)
        load[a] += costs[name]
    return out


class TeamOracle:
    """Several agents finishing the dishes together on one :class:`World` (module docstring)."""

    def __init__(self, world: World, assignment: dict[str, list[str]], *, release: bool | None = None):
        self.world = world
        self.assignment = {a: list(d) for a, d in assignment.items()}
        shared = world.read(lambda s: s.shared_inventory)
        self.release = (not shared) if release is None else release

    def next(self, agent: str) -> str:
        """The agent's next command, re-planned on the current shared state (``look`` to wait)."""
        dishes = self.assignment.get(agent, [])
        if not dishes:
            return WAIT
        return self.world.read(lambda s: next_command(s, agent, dishes, release=self.release))

    def run(self, max_rounds: int = 10_000, patience: int = 3) -> int:
        """Steps every agent in turn (one command each per round) until the world is won or lost, every agent is
        done (budget spent), ``patience`` rounds in a row in which every agent only waited (a deadlock), or
        ``max_rounds``; returns the number of rounds (the team's makespan in steps)."""
        agents = list(self.assignment)
        idle = 0
        for rounds in range(1, max_rounds + 1):
            moved, alive = False, False
            for agent in agents:
                if self.world.won or self.world.lost:
                    return rounds
                command = self.next(agent)
                result = self.world.step(agent, command)
                moved = moved or command != WAIT
                alive = alive or not result.done
            idle = 0 if moved else idle + 1
            if not alive or idle >= patience or self.world.won or self.world.lost:
                return rounds
        return max_rounds
