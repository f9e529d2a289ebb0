"""The client's exception classes are the server's error codes: no more, no fewer.

The classes are generated (``make generate``) from the server's one list of codes,
internal/errcodes/errcodes.go, which also writes the OpenAPI document's Error enum; a Go
test holds that list to what the server answers. Here: the classes are exactly the
enum's codes, so a hand edit of either, or a forgotten ``make generate``, fails.
"""

import json
import os
import unittest

import harness  # noqa: F401 - puts the package on sys.path

import airlock
from airlock import errors

HTTPAPI = os.path.join(harness.REPO, "internal", "httpapi")


def openapi_codes():
    with open(os.path.join(HTTPAPI, "openapi.json"), encoding="utf-8") as f:
        doc = json.load(f)
    return doc["components"]["schemas"]["Error"]["properties"]["error"]["enum"]


class ErrorCodesTest(unittest.TestCase):
    def test_one_class_per_server_code(self):
        api = openapi_codes()
        self.assertGreater(len(api), 40, "the OpenAPI Error enum lists too few codes")
        self.assertEqual(len(api), len(set(api)), "a code is listed twice in the OpenAPI Error enum")
        want = set(api)
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
