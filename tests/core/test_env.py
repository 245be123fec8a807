import pytest

from app.env import SettingError, env_bool, env_choice, env_int, env_list, env_str


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("true", True), ("YES", True), ("1", True), ("off", False), ("False", False), ("", None)],
)
def test_env_bool_reads_the_usual_spellings(
    monkeypatch: pytest.MonkeyPatch, raw: str, expected: bool | None
) -> None:
    monkeypatch.setenv("FLAG", raw)
    assert env_bool("FLAG", default=None) is expected  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("reader", "raw", "message"),
    [
        (lambda: env_bool("V", False), "maybe", "V='maybe' is not a boolean"),
        (lambda: env_int("V", 1), "ten", "V='ten' is not an integer"),
        (lambda: env_int("V", 1, minimum=1), "0", "V=0 must be at least 1"),
        (lambda: env_choice("V", "a", ("a", "b")), "c", "V='c' must be one of a, b"),
        (lambda: env_str("V"), "", "V must be set"),
    ],
)
def test_a_bad_value_fails_loudly_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, reader: object, raw: str, message: str
) -> None:
    monkeypatch.setenv("V", raw)
    with pytest.raises(SettingError, match=message):
        reader()  # type: ignore[operator]


def test_env_list_splits_on_commas_and_drops_blanks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOSTS", " a.example , b.example,, ")
    assert env_list("HOSTS", []) == ["a.example", "b.example"]
    monkeypatch.delenv("HOSTS")
    assert env_list("HOSTS", ["localhost"]) == ["localhost"]
