"""The server's seams, checked: mypy (scripts/test.sh) proves here that the real classes
satisfy the Protocols of engine/interfaces.py (and engine/outputs.TokenConstraint). Nothing
imports this module at run time.

NOTE: the Protocols are structural (nothing subclasses them), so without these functions a
method renamed on one side would pass every type check and fail only when called.
"""

from __future__ import annotations

from dspark_loop.api.chat.tool_constraint import ToolConstraint
from dspark_loop.engine.interfaces import EngineClient, MeshClient, PipelinedMeshClient
from dspark_loop.engine.loop import EngineLoop
from dspark_loop.engine.outputs import TokenConstraint
from dspark_loop.mesh.mesh import Mesh
from dspark_loop.pending_engine import PendingEngine


def engine_loop_is_an_engine_client(engine: EngineLoop) -> EngineClient:
    return engine


def pending_engine_is_an_engine_client(engine: PendingEngine) -> EngineClient:
    return engine


def mesh_is_a_mesh_client(mesh: Mesh) -> MeshClient:
    return mesh


def mesh_is_a_pipelined_mesh_client(mesh: Mesh) -> PipelinedMeshClient:
    return mesh


def tool_constraint_is_a_token_constraint(constraint: ToolConstraint) -> TokenConstraint:
    return constraint
