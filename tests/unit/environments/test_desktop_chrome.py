"""OSWorld's Chrome getters and checks, read from a profile's files as desktop-env 1.0.2 reads them,
and which Chrome tasks load as supported."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agentinfra.environments.desktop import _evaluate as evaluate
from agentinfra.environments.desktop import load_desktop_task, support
from agentinfra.environments.desktop._task import GETTERS

CHROME = ["google-chrome", "--remote-debugging-port=1337"]


@pytest.fixture
def profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A Chrome profile at ~/.config/google-chrome, as the grading jail sees the snapshot."""
    home = tmp_path / "home"
    real_file = evaluate._file

    def jailed(path: str) -> Any:
        if path.startswith("/home/user/"):
            found = real_file(path)  # the real check refuses paths outside the jail's home
            assert found is None
            local = home / path.removeprefix("/home/user/")
            return evaluate.FileValue(local) if local.is_file() else None
        return real_file(path)

    monkeypatch.setattr(evaluate, "_file", jailed)
    root = home / ".config" / "google-chrome"
    (root / "Default").mkdir(parents=True)
    return root


def get(name: str) -> Any:
    return evaluate.resolve({"kind": "chrome", "getter": name})


def write(root: Path, name: str, data: Any) -> None:
    (root / name).write_text(data if isinstance(data, str) else json.dumps(data))


def test_each_getter_reads_its_setting_from_the_profile(profile: Path) -> None:
    write(profile, "Default/Preferences", {
        "default_search_provider_data": {"template_url_data": {"short_name": "Bing"}},
        "profile": {"name": "Thomas", "default_content_setting_values": {"cookies": 4}},
        "webkit": {"webprefs": {"default_font_size": 20}},
        "enable_do_not_track": True,
        "safebrowsing": {"enhanced": True},
        "session": {"restore_on_startup": 5},
        "extensions": {"settings": {"a": {"path": "/home/user/ext", "manifest": {"name": "Helper"}}}},
    })  # fmt: skip
    write(profile, "Local State", {"browser": {"enabled_labs_experiments": ["smooth-scrolling@1"]},
                                   "intl": {"app_locale": "de"}})  # fmt: skip
    write(profile, "Default/Bookmarks", {"roots": {"bookmark_bar": {"children": []}}})
    assert get("default_search_engine") == "Bing"
    assert get("profile_name") == "Thomas"
    assert get("chrome_font_size") == {"default_font_size": 20}
    assert get("enable_do_not_track") == "true"
    assert get("enable_enhanced_safety_browsing") == "true"
    assert get("new_startup_page") == "true"
    assert get("find_unpacked_extension_path") == ["/home/user/ext"]
    assert get("find_installed_extension_name") == ["Helper"]
    assert get("data_delete_automacally") == "true"
    assert get("enabled_experiments") == ["smooth-scrolling@1"]
    assert get("chrome_language") == "de"
    assert get("bookmarks") == {"bookmark_bar": {"children": []}}
    write(profile, "Default/Preferences", {"session": {"restore_on_startup": 1}, "profile": {}})
    assert get("new_startup_page") == "false"
    assert get("data_delete_automacally") == "false"
    assert get("enable_do_not_track") == "false"


def test_a_missing_or_broken_profile_reads_as_osworld_falls_back(profile: Path) -> None:
    """Each getter's own fallback, "Google" included where OSWorld's returns it for any failure;
    the bookmarks are [] for no file and an error for a broken one (OSWorld's has no fallback)."""
    fallbacks = {
        "default_search_engine": "Google", "profile_name": None, "enabled_experiments": [],
        "chrome_language": "en-US", "bookmarks": [], "enable_do_not_track": "false",
        "chrome_font_size": {"default_fixed_font_size": 13, "default_font_size": 16},
        "enable_enhanced_safety_browsing": "Google", "new_startup_page": "Google",
        "find_unpacked_extension_path": "Google", "find_installed_extension_name": "Google",
        "data_delete_automacally": "Google",
    }  # fmt: skip
    assert set(fallbacks) == set(evaluate.CHROME_GETTERS)
    for name, value in fallbacks.items():
        assert get(name) == value, name
    write(profile, "Default/Preferences", "{not json")
    write(profile, "Default/Bookmarks", "{not json")
    assert get("default_search_engine") == "Google"
    with pytest.raises(json.JSONDecodeError):
        get("bookmarks")
    write(profile, "Default/Preferences", {"extensions": {"settings": {"a": {"path": "/p"}}}})
    assert get("find_unpacked_extension_path") == ["/p"]
    assert get("find_installed_extension_name") == "Google"  # no manifest: OSWorld's gives up


def test_the_chrome_checks() -> None:
    bar = {"bookmark_bar": {"children": [
        {"type": "folder", "name": "Favorites", "children": []},
        {"type": "url", "name": "a", "url": "https://a.example/"},
        {"type": "folder", "name": "Liked Authors", "children": [
            {"type": "url", "url": "https://x.example/"}, {"type": "url", "url": "https://y.example/"}]},
    ]}}  # fmt: skip
    folders = {"type": "bookmark_bar_folders_names", "names": ["Favorites", "Liked Authors"]}
    assert evaluate.is_expected_bookmarks(bar, folders) == 1.0
    assert evaluate.is_expected_bookmarks(bar, {**folders, "names": ["Favorites"]}) == 0.0
    assert evaluate.is_expected_bookmarks([], folders) == 0.0
    urls = {"type": "bookmark_bar_websites_urls", "urls": ["https://a.example/"]}
    assert evaluate.is_expected_bookmarks(bar, urls) == 1.0
    liked = {"type": "liked_authors_websites_urls",
             "urls": [["https://x.example/", "https://x2.example/"], "https://y.example/"]}  # fmt: skip
    assert evaluate.is_expected_bookmarks(bar, liked) == 1.0
    assert evaluate.is_expected_bookmarks(bar, {**liked, "urls": ["https://x.example/"]}) == 0.0
    with pytest.raises(TypeError, match="not support yet"):
        evaluate.is_expected_bookmarks(bar, {"type": "tags"})
    experiments = {"type": "names", "names": ["a", "b"]}
    assert evaluate.check_enabled_experiments(["a@1", "b@2"], experiments) == 1.0
    assert evaluate.check_enabled_experiments(["b@1", "a@1"], experiments) == 0.0  # in order
    assert (
        evaluate.check_font_size({"default_font_size": 20}, {"type": "value", "value": 20}) == 1.0
    )
    between = {"type": "range", "min": 16, "max": 20}
    assert evaluate.check_font_size({"default_font_size": 20}, between) == 0.0  # bounds excluded
    assert evaluate.check_font_size({"default_font_size": 18}, between) == 1.0
    assert evaluate.match_in_list("Bing", {"expected": ["Microsoft Bing", "Bing"]}) == 1.0
    assert evaluate.match_in_list("Google", {"expected": ["Bing"]}) == 0.0
    assert evaluate.is_in_list(["/p", "/q"], {"expected": "/q"}) == 1.0
    assert evaluate.is_in_list("Google", {"expected": "/q"}) == 0.0
    installed = {"expected": ["Helper", "Dark"]}
    assert evaluate.is_expected_installed_extensions(["Dark", "Helper", "X"], installed) == 1.0
    assert evaluate.is_expected_installed_extensions(["Dark"], installed) == 0.0


def chrome_task(tmp_path: Path, result: dict[str, Any], **changes: Any) -> Path:
    """A task in the shape of OSWorld's Chrome settings tasks (our own words)."""
    document: dict[str, Any] = {
        "id": "c", "instruction": "change a browser setting", "related_apps": ["chrome"], "proxy": False,
        "config": [{"type": "launch", "parameters": {"command": CHROME}},
                   {"type": "launch", "parameters": {"command": ["socat", "tcp-listen:9222,fork",
                                                                 "tcp:localhost:1337"]}}],
        "evaluator": {
            "postconfig": [{"type": "launch", "parameters": {"command": ["pkill", "chrome"]}},
                           {"type": "launch", "parameters": {"command": CHROME}},
                           {"type": "sleep", "parameters": {"seconds": 3}}],
            "func": "exact_match", "result": result,
            "expected": {"type": "rule", "rules": {"expected": "true"}},
        },
    }  # fmt: skip
    document.update(changes)
    path = tmp_path / "chrome.json"
    path.write_text(json.dumps(document))
    return path


def test_chrome_tasks_that_read_the_profile_are_supported(tmp_path: Path) -> None:
    assert set(evaluate.CHROME_GETTERS) <= set(GETTERS)
    task = load_desktop_task(chrome_task(tmp_path, {"type": "enable_do_not_track"}))
    assert support(task, None).supported, support(task, None).reason


@pytest.mark.parametrize(
    ("result", "changes", "reason"),
    [
        ({"type": "data_delete_automacally"}, {}, "a do-nothing episode would pass"),
        ({"type": "open_tabs_info"}, {}, "not implemented: open_tabs_info"),
        ({"type": "enable_do_not_track"},
         {"config": [{"type": "chrome_open_tabs", "parameters": {"urls_to_open": ["https://a.example"]}}]},
         "needs the live web"),
    ],
)  # fmt: skip
def test_chrome_tasks_we_cannot_grade_faithfully_say_why(
    tmp_path: Path, result: dict[str, Any], changes: dict[str, Any], reason: str
) -> None:
    verdict = support(load_desktop_task(chrome_task(tmp_path, result, **changes)), None)
    assert not verdict.supported
    assert reason in verdict.reason
