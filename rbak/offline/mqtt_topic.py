"""MQTT topics as RabbitMQ's MQTT plugin turns them into AMQP routing keys: one rule for the
Mosquitto import (text) and RabbitMQ 4.x messages of MQTT origin (``mc_mqtt``, bytes)."""

from __future__ import annotations

from typing import AnyStr


def mqtt_to_amqp(topic: AnyStr) -> AnyStr:
    """``rabbit_mqtt_util:mqtt_to_amqp/1`` without Sparkplug: ``/`` -> ``.``, ``+`` -> ``*``
    (text from mosquitto.db, bytes from a RabbitMQ 4.x ``mc_mqtt`` container)."""
    if isinstance(topic, bytes):
        return topic.replace(b"/", b".").replace(b"+", b"*")
    return topic.replace("/", ".").replace("+", "*")
