"""The client's exception classes are the server's error codes: no more, no fewer.

The codes come from the server's source (every `http.Status…, "code"` and `Code: "…"` in
internal/httpapi, where errors.go's table and the handlers name them) and from the
OpenAPI document's Error enum, so a code added to the server without a class here fails
this test.
"""

import glob
import json
import os
import re
import unittest

import harness  # noqa: F401 - puts the package on sys.path

import airlock
from airlock import errors

HTTPAPI = os.path.join(harness.REPO, "internal", "httpapi")


def server_codes():
    codes = set()
    for path in glob.glob(os.path.join(HTTPAPI, "*.go")):
        if path.endswith("_test.go"):
            continue
        with open(path, encoding="utf-8") as f:
            src = f.read()
        codes.update(re.findall(r'http\.Status[A-Za-z]+,\s*"([a-z_]+)"', src))
        codes.update(re.findall(r'Code:\s*"([a-z_]+)"', src))
    return codes


def openapi_codes():
    with open(os.path.join(HTTPAPI, "openapi.json"), encoding="utf-8") as f:
        doc = json.load(f)
    return set(doc["components"]["schemas"]["Error"]["properties"]["error"]["enum"])


class ErrorCodesTest(unittest.TestCase):
    def test_one_class_per_server_code(self):
        src, api = server_codes(), openapi_codes()
        self.assertGreater(len(src), 40, "the scan of internal/httpapi found too few codes")
        want = src | api
        self.assertEqual(set(errors.CODES) - want, set(), "classes for codes the server never answers")
        self.assertEqual(want - set(errors.CODES), set(), "server codes without a class in airlock/errors.py")

    def test_classes_are_exported_and_named_for_their_code(self):
        for code in errors.CODES:
            name = "".join(p.capitalize() for p in code.split("_")) + "Error"
            cls = getattr(airlock, name)
            self.assertTrue(issubclass(cls, airlock.APIError))
            self.assertEqual(cls.code, code)
            e = errors.error_for(409, {"error": code, "message": "m"})
            self.assertIs(type(e), cls)
            self.assertEqual((e.status, e.code, e.message), (409, code, "m"))

    def test_an_answer_not_in_airlocks_format(self):
        e = errors.error_for(502, "<html>bad gateway</html>" + "x" * 300)
        self.assertIs(type(e), airlock.APIError)
        self.assertEqual(e.code, "")
        self.assertLessEqual(len(e.message), 201)
        e = errors.error_for(418, {"error": "brand_new_code", "message": "later"})
        self.assertIs(type(e), airlock.APIError)
        self.assertEqual(e.code, "brand_new_code")


if __name__ == "__main__":
    unittest.main()
