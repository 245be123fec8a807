"""An operation's id in the OpenAPI schema is what a client generated from it calls: it stays when its
view moves to another module (django-ninja derives the default from the view's module)."""

from app.api.api import api

# The template repositories' operations, in app/api/templates.py until they moved to repositories.py.
REPOSITORY_OPERATIONS = {
    ("post", "/api/v1/templates/hooks/git"): "app_api_templates_git_hook",
    ("post", "/api/v1/templates/repositories"): "app_api_templates_register_repository",
    ("get", "/api/v1/templates/repositories"): "app_api_templates_list_repositories",
    ("get", "/api/v1/templates/repositories/{repository_id}"): "app_api_templates_get_repository",
    ("post", "/api/v1/templates/repositories/{repository_id}/import"): "app_api_templates_import_repository",
}


def test_the_template_repositories_operations_keep_their_ids_and_tag() -> None:
    paths = api.get_openapi_schema()["paths"]
    found = {(method, path): paths[path][method] for method, path in REPOSITORY_OPERATIONS}
    assert {key: op["operationId"] for key, op in found.items()} == REPOSITORY_OPERATIONS
    assert all(op["tags"] == ["templates"] for op in found.values())


def test_operation_ids_are_unique() -> None:
    ids = [op["operationId"] for ops in api.get_openapi_schema()["paths"].values() for op in ops.values()]
    assert len(ids) == len(set(ids))
