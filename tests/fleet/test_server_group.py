"""A server's group (the owner its capacity, restart and KV-stream alerts are routed to): the demo
fleet takes the default, and registering a server again keeps the group a person gave it."""

import io

import pytest
from django.core.management import call_command

from app.fleet.models import Server

pytestmark = pytest.mark.django_db


def test_the_demo_fleet_is_the_platform_groups_and_keeps_a_group_given_since() -> None:
    call_command("register_demo_fleet", stdout=io.StringIO())

    groups = dict(Server.objects.values_list("name", "group"))
    assert len(groups) == 4 and set(groups.values()) == {"platform"}

    first = min(groups)
    Server.objects.filter(name=first).update(group="inference-eu")
    call_command("register_demo_fleet", stdout=io.StringIO())  # devstack runs it on every start

    assert dict(Server.objects.values_list("name", "group")) == groups | {first: "inference-eu"}
