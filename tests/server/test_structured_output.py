"""Structured output through the official openai client: response_format
json_schema / json_object give content that validates (under the jsonschema
package, independent of the engine) with properties in the schema's order;
unsupported schemas and tools on a template without them are 400s naming the
field. Every request goes to 127.0.0.1 and is bounded in tokens."""
import json
import os

import jsonschema
import openai
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
with open(os.path.join(ROOT, "examples", "person.schema.json")) as f:
    PERSON = json.load(f)


def client_for(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=300)


def test_json_schema_content_validates_in_schema_order(server):
    c = client_for(server)
    r = c.chat.completions.create(
        model="kvtier", messages=[{"role": "user", "content": "Invent a person."}], max_tokens=200,
        temperature=0, response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}})
    assert r.choices[0].finish_reason == "stop"
    content = r.choices[0].message.content
    jsonschema.validate(json.loads(content), PERSON)
    keys = [k for k, _ in json.loads(content, object_pairs_hook=lambda pairs: pairs)]
    assert keys == list(PERSON["properties"]), content


def test_json_object_chat_and_completion(server):
    c = client_for(server)
    r = c.chat.completions.create(
        model="kvtier", messages=[{"role": "user", "content": "A cat as JSON: name and colour."}], max_tokens=120,
        temperature=0, response_format={"type": "json_object"})
    assert isinstance(json.loads(r.choices[0].message.content), dict)
    r = c.completions.create(model="kvtier", prompt="A JSON object describing a dog:", max_tokens=80, temperature=0,
                             extra_body={"response_format": {"type": "json_object"}})
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].text), dict)


def test_refusals_name_the_field(server):
    c = client_for(server)
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(
            model="kvtier", messages=[{"role": "user", "content": "x"}], max_tokens=4,
            response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": {
                "type": "object", "properties": {"n": {"type": "integer", "multipleOf": 2}}}}})
    assert e.value.body["param"] == "response_format.json_schema.schema"
    assert "properties.n: keyword 'multipleOf' is not supported" in e.value.body["message"]
    # SmolLM2's chat template has no tools.
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(
            model="kvtier", messages=[{"role": "user", "content": "Weather in Paris?"}], max_tokens=4,
            tools=[{"type": "function", "function": {"name": "get_weather", "parameters": {
                "type": "object", "properties": {"city": {"type": "string"}}}}}], tool_choice="required")
    assert e.value.body["param"] == "tools"
    assert "no tool support" in e.value.body["message"]
