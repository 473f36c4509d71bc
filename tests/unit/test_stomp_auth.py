import pytest

from gearhorn.rules import auth

FAST = 1000  # iterations: the tests check behaviour, not cost


def credentials_file(**users):
    lines = []
    for name, (passcode, read, write) in users.items():
        lines += [f"[user {name}]", f"passcode = {auth.hash_passcode(passcode, FAST)}",
                  f"read = {read}", f"write = {write}", ""]
    return "\n".join(lines)


def test_hashes_are_salted_and_verify():
    first, second = auth.hash_passcode("s3cret", FAST), auth.hash_passcode("s3cret", FAST)
    assert first != second and "s3cret" not in first
    assert auth.verify_passcode("s3cret", first) and auth.verify_passcode("s3cret", second)
    assert not auth.verify_passcode("s3cret!", first)


def test_users_get_what_their_patterns_allow_and_nothing_else():
    creds = auth.parse(credentials_file(
        alice=("pa", "/topic/news.*, /queue/jobs", "/queue/jobs"), bob=("pb", "", "")))
    alice = creds.authenticate("alice", "pa")
    assert alice.may_read("/topic/news.sports") and alice.may_read("/topic/news.*")
    assert alice.may_read("/queue/jobs") and alice.may_write("/queue/jobs")
    assert not alice.may_read("/topic/newsroom") and not alice.may_write("/topic/news.x")
    assert not alice.may_read("/topic/*")  # a wider subscription than allowed
    bob = creds.authenticate("bob", "pb")
    assert not bob.may_read("/queue/jobs") and not bob.may_write("/queue/jobs")


def test_bad_logins_and_anonymous_access():
    text = credentials_file(alice=("pa", "*", "*"))
    closed = auth.parse(text)
    assert closed.authenticate("alice", "wrong") is None
    assert closed.authenticate("alice", None) is None
    assert closed.authenticate("mallory", "pa") is None
    assert closed.authenticate(None, None) is None  # no [anonymous] section
    opened = auth.parse(text + "\n[anonymous]\nread = /topic/public.*\n")
    guest = opened.authenticate(None, None)
    assert guest.name == "anonymous" and guest.may_read("/topic/public.x")
    assert not guest.may_write("/topic/public.x")
    assert opened.authenticate("alice", "wrong") is None  # a login is always checked


def test_a_verified_passcode_is_remembered_by_digest_only():
    creds = auth.parse(credentials_file(alice=("pa", "*", "*")))
    assert creds.authenticate("alice", "pa") is creds.authenticate("alice", "pa")
    assert all(digest != "pa" for _, digest in creds._verified)


def test_no_file_means_an_open_bridge():
    creds = auth.Credentials.open()
    assert creds.authenticate("anyone", "anything") is auth.OPEN
    assert auth.OPEN.may_write("/queue/x") and auth.OPEN.may_read("/topic/y")


@pytest.mark.parametrize("text, reason", [
    ("[user alice]\npasscode = hunter2\n", "passcode must be a pbkdf2_sha256 hash"),
    ("[user alice]\nread = *\n", "passcode must be a pbkdf2_sha256 hash"),
    ("[admin]\nread = *\n", "sections are [user NAME] or [anonymous]"),
    ("[anonymous]\nrights = *\n", "unknown key 'rights'"),
    ("read = *\n", "File contains no section headers"),
])
def test_unusable_files_are_refused_with_the_reason(text, reason):
    with pytest.raises(auth.CredentialsError) as exc:
        auth.parse(text, "creds.ini")
    assert reason in str(exc.value) and "hunter2" not in str(exc.value)


def test_set_passcode_adds_or_replaces_a_hashed_passcode():
    text = auth.set_passcode("", "alice", "first")
    creds = auth.parse(text)
    assert creds.authenticate("alice", "first") is not None and "first" not in text
    again = auth.parse(auth.set_passcode(text, "alice", "second"))
    assert again.authenticate("alice", "first") is None
    assert again.authenticate("alice", "second") is not None
