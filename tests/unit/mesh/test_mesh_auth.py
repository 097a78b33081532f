"""The mesh's shared-secret rules: where the secret comes from and what the proofs bind."""

from __future__ import annotations

import pytest

from dspark_loop.contract.mesh_auth import (
    MIN_SECRET_LEN,
    SECRET_ENV,
    SecretError,
    client_proof,
    new_nonce,
    resolve_secret,
    same,
    secret_from_env,
    server_proof,
)

SECRET = "s" * MIN_SECRET_LEN


def test_one_host_run_without_a_secret_gets_a_fresh_one_per_run():
    """A one-host run must work without DSPARK_MESH_SECRET: each run generates its own,
    long and different from the last."""
    first, generated = resolve_secret(1, {})
    second, _ = resolve_secret(1, {})
    assert generated and first != second and len(first) >= 32


def test_several_nodes_without_a_secret_are_refused_with_the_variable_named():
    """--nnodes > 1 must refuse to start without the secret, naming the variable and the
    flag that made it necessary."""
    with pytest.raises(SecretError, match=f"{SECRET_ENV} must be set.*--nnodes 2"):
        resolve_secret(2, {})


def test_a_set_secret_is_used_as_is_and_a_short_one_is_refused():
    """A secret from the environment must be used unchanged; one shorter than the minimum
    must be refused with its length."""
    assert resolve_secret(2, {SECRET_ENV: SECRET}) == (SECRET, False)
    with pytest.raises(SecretError, match=f"at least {MIN_SECRET_LEN} characters \\(got 5\\)"):
        resolve_secret(1, {SECRET_ENV: "short"})


def test_a_spawned_process_without_the_secret_is_told_why():
    """A rank started without the variable must fail with a message naming it."""
    with pytest.raises(SecretError, match=f"{SECRET_ENV} is not set"):
        secret_from_env({})
    assert secret_from_env({SECRET_ENV: SECRET}) == SECRET


def test_proofs_bind_the_secret_the_nonces_and_the_message():
    """A proof must change with the secret, either nonce and the message body, so neither a
    guessed secret nor a replay under a new nonce nor an edited Hello passes."""
    cn, sn = new_nonce(), new_nonce()
    assert len(cn) == 16 and cn != sn
    proof = server_proof(SECRET, cn, sn)
    assert same(proof, server_proof(SECRET, cn, sn))
    assert not same(proof, server_proof(SECRET + "x", cn, sn))
    assert not same(proof, server_proof(SECRET, new_nonce(), sn))
    mac = client_proof(SECRET, sn, b"hello")
    assert not same(mac, client_proof(SECRET, new_nonce(), b"hello"))
    assert not same(mac, client_proof(SECRET, sn, b"hellO"))
    assert not same(mac, client_proof("t" * MIN_SECRET_LEN, sn, b"hello"))
    # NOTE: the two directions are tagged: a server proof can never pass as a client mac.
    assert not same(server_proof(SECRET, cn, sn), client_proof(SECRET, sn, cn))
