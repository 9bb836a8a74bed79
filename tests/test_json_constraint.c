/*
 * test_json_constraint.c — the structured-output acceptor
 * (src/sample/json_constraint.c): schema compilation and its refusals, valid
 * and invalid prefixes, completion, and random walks through the acceptor
 * whose every finished document must parse and validate (an independent
 * validator below, over cJSON), including walks cut short by a budget and
 * closed by the shortest completion.
 */
#include "testutil.h"
#include "sample/json_constraint.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static ks_json_schema *compile(const char *schema) {
    ks_json_schema *s = NULL;
    char where[256];
    ks_status st = ks_json_schema_compile(schema, schema ? strlen(schema) : 0, &s, where, sizeof where);
    if (st != KS_OK) fail_msg("%s: %s", schema, ks_last_error());
    return s;
}

static bool accepts(const ks_json_schema *s, const char *text, bool *complete) {
    ks_json_state st;
    ks_json_state_init(s, &st);
    bool ok = ks_json_state_feed(s, &st, text, strlen(text));
    if (complete) *complete = ok && ks_json_state_complete(s, &st);
    return ok;
}

static void yes(const ks_json_schema *s, const char *text, bool whole) {
    bool c;
    if (!accepts(s, text, &c)) fail_msg("rejected: %s", text);
    if (c != whole) fail_msg("%s: complete %d, want %d", text, c, whole);
}
static void no(const ks_json_schema *s, const char *text) {
    if (accepts(s, text, NULL)) fail_msg("accepted: %s", text);
}

static const char *PERSON =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"bb\",1,null]}},\"ok\":{\"type\":\"boolean\"},"
    "\"score\":{\"type\":\"number\"},\"nested\":{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"null\"}},"
    "\"required\":[\"x\"]}},\"required\":[\"name\",\"age\"],\"additionalProperties\":false}";

static void test_prefixes(void **state) {
    (void)state;
    ks_json_schema *s = compile(PERSON);
    yes(s, "", false);
    yes(s, "{", false);
    yes(s, "{\"name\":\"Bob \\u00e9 \\n\xc3\xa9\",\"age\":-12}", true);
    yes(s, "{\"age\":0,\"name\":\"\"}", true);
    yes(s, "{\"name\":\"x\",\"age\":3,\"tags\":[\"bb\",1,null,\"a\"],\"ok\":true,\"score\":-1.5e+3,\"nested\":{\"x\":null}}", true);
    yes(s, "{\"name\":\"x\",\"age\":3,\"tags\":[]}", true);
    yes(s, "{\"na", false);
    no(s, " {");                          /* compact: no whitespace */
    no(s, "{\"name\":\"x\"}");            /* age is required */
    no(s, "{\"name\":\"x\",\"name\":");   /* a key once */
    no(s, "{\"nam\":");                   /* not a property */
    no(s, "{\"age\":1.5");                /* an integer */
    no(s, "{\"age\":01");                 /* no leading zeros */
    no(s, "{\"name\":1");
    no(s, "{\"name\":\"a\nb\"");          /* raw control character */
    no(s, "{\"name\":\"\\x\"");           /* bad escape */
    no(s, "{\"name\":\"\\ud800");          /* a lone surrogate half */
    no(s, "{\"score\":1e1000");             /* an exponent that overflows */
    no(s, "{\"name\":\"\xc3(\"");         /* bad UTF-8 */
    no(s, "{\"tags\":[\"c\"]");
    no(s, "{\"tags\":[2]");
    no(s, "{\"nested\":{}");
    no(s, "{\"ok\":tru}");
    no(s, "{\"name\":\"x\",\"age\":1}x"); /* nothing after the document */
    no(s, "{}");
    ks_json_schema_destroy(s);

    s = compile(NULL); /* json_object: any object */
    yes(s, "{}", true);
    yes(s, "{\"k\":[1,{\"a\":\"b\"},true,null,-0.5],\"\":{}}", true);
    no(s, "[]");
    no(s, "\"x\"");
    ks_json_schema_destroy(s);

    s = compile("{\"type\":\"number\"}"); /* a top-level number ends when the text does */
    yes(s, "12", true);
    yes(s, "-", false);
    yes(s, "1.", false);
    no(s, "1.2.3");
    ks_json_schema_destroy(s);

    s = compile("{\"enum\":[\"red\",\"green\",10,1]}");
    yes(s, "\"red\"", true);
    yes(s, "1", true);
    yes(s, "10", true);
    no(s, "\"blue\"");
    no(s, "2");
    ks_json_schema_destroy(s);

    s = compile("{\"type\":\"string\",\"const\":\"only\"}");
    yes(s, "\"only\"", true);
    no(s, "\"onlx\"");
    ks_json_schema_destroy(s);
}

static void test_refusals(void **state) {
    (void)state;
    static const struct {
        const char *schema;
        ks_status st;
        const char *names;
    } bad[] = {
        {"{\"type\":\"string\",\"pattern\":\"^a\"}", KS_ERR_UNSUPPORTED, "'pattern' at /"},
        {"{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"string\",\"minLength\":3}}}", KS_ERR_UNSUPPORTED,
         "'minLength' at /properties/n"},
        {"{\"anyOf\":[{\"type\":\"string\"}]}", KS_ERR_UNSUPPORTED, "'anyOf'"},
        {"{\"$ref\":\"#/x\"}", KS_ERR_UNSUPPORTED, "'$ref'"},
        {"{\"type\":[\"string\",\"null\"]}", KS_ERR_UNSUPPORTED, "'type'"},
        {"{\"type\":\"object\",\"additionalProperties\":{\"type\":\"string\"}}", KS_ERR_UNSUPPORTED,
         "additionalProperties"},
        {"{\"type\":\"object\",\"properties\":{},\"required\":[\"x\"]}", KS_ERR_UNSUPPORTED, "required 'x'"},
        {"{\"type\":\"strin\"}", KS_ERR_INVALID_ARG, "unknown type"},
        {"{\"enum\":[]}", KS_ERR_INVALID_ARG, "enum"},
        {"{\"enum\":[[1]]}", KS_ERR_UNSUPPORTED, "enum"},
        {"[1]", KS_ERR_INVALID_ARG, "object"},
        {"{", KS_ERR_INVALID_ARG, "JSON"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ks_json_schema *s = NULL;
        char where[256];
        ks_status st = ks_json_schema_compile(bad[i].schema, strlen(bad[i].schema), &s, where, sizeof where);
        if (st != bad[i].st) fail_msg("%s: status %d, want %d (%s)", bad[i].schema, (int)st, (int)bad[i].st, where);
        if (!strstr(where, bad[i].names)) fail_msg("%s: '%s' lacks '%s'", bad[i].schema, where, bad[i].names);
        assert_null(s);
    }
    /* deep nesting is refused, not a stack overflow */
    char deep[8192] = "";
    for (int i = 0; i < 200; i++) strcat(deep, "{\"type\":\"array\",\"items\":");
    strcat(deep, "{\"type\":\"null\"}");
    for (int i = 0; i < 200; i++) strcat(deep, "}");
    ks_json_schema *s = NULL;
    char where[256];
    assert_int_equal(ks_json_schema_compile(deep, strlen(deep), &s, where, sizeof where), KS_ERR_UNSUPPORTED);
}

/* ---- an independent validator of the subset ---- */
static bool validate(const cJSON *schema, const cJSON *v) {
    if (!schema || cJSON_IsTrue(schema)) return true;
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(schema, "enum");
    if (en) {
        const cJSON *e;
        cJSON_ArrayForEach(e, en) if (cJSON_Compare(e, v, true)) return true;
        return false;
    }
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(schema, "type");
    if (!ty) return true;
    const char *t = ty->valuestring;
    if (!strcmp(t, "string")) return cJSON_IsString(v);
    if (!strcmp(t, "number")) return cJSON_IsNumber(v);
    if (!strcmp(t, "integer")) return cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble);
    if (!strcmp(t, "boolean")) return cJSON_IsBool(v);
    if (!strcmp(t, "null")) return cJSON_IsNull(v);
    if (!strcmp(t, "array")) {
        if (!cJSON_IsArray(v)) return false;
        const cJSON *e;
        cJSON_ArrayForEach(e, v) if (!validate(cJSON_GetObjectItemCaseSensitive(schema, "items"), e)) return false;
        return true;
    }
    if (!cJSON_IsObject(v)) return false;
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(schema, "properties"), *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(schema, "required")) if (!cJSON_GetObjectItemCaseSensitive(v, e->valuestring)) return false;
    cJSON_ArrayForEach(e, v) {
        if (!props) continue;
        const cJSON *ps = cJSON_GetObjectItemCaseSensitive(props, e->string);
        if (!ps || !validate(ps, e)) return false;
    }
    return true;
}

static uint64_t rng = 88172645463325252ull;
static uint32_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)rng;
}

/* Random walks: at each step one of the bytes the acceptor allows (all 256
 * tried), stopping at a random budget and closing with the completion. */
static void walk(const char *schema_text, int walks) {
    ks_json_schema *s = compile(schema_text);
    cJSON *schema = schema_text ? cJSON_Parse(schema_text) : cJSON_Parse("{\"type\":\"object\"}");
    char doc[4096];
    for (int w = 0; w < walks; w++) {
        ks_json_state st;
        ks_json_state_init(s, &st);
        size_t n = 0, budget = 1 + rnd() % 300;
        while (n < budget && !(st.n == 0 && st.done)) {
            unsigned char ok[256];
            int n_ok = 0;
            for (int c = 1; c < 256; c++) {
                ks_json_state t = st;
                unsigned char b = (unsigned char)c;
                if (ks_json_state_feed(s, &t, (const char *)&b, 1)) ok[n_ok++] = b;
            }
            if (n_ok == 0) break; /* a complete top-level scalar */
            /* prefer closing bytes now and then so documents finish */
            unsigned char b = ok[rnd() % (uint32_t)n_ok];
            assert_true(ks_json_state_feed(s, &st, (const char *)&b, 1));
            doc[n++] = (char)b;
        }
        size_t k = ks_json_state_finish(s, &st, doc + n, sizeof doc - n);
        assert_true(n + k < sizeof doc);
        ks_json_state t;
        ks_json_state_init(s, &t);
        assert_true(ks_json_state_feed(s, &t, doc, n + k));
        if (!ks_json_state_complete(s, &t)) fail_msg("not complete: %.*s", (int)(n + k), doc);
        cJSON *v = cJSON_ParseWithLength(doc, n + k);
        if (!v) fail_msg("does not parse: %.*s", (int)(n + k), doc);
        if (!validate(schema, v)) fail_msg("does not validate: %.*s", (int)(n + k), doc);
        cJSON_Delete(v);
    }
    cJSON_Delete(schema);
    ks_json_schema_destroy(s);
}

static void test_walks(void **state) {
    (void)state;
    walk(PERSON, 300);
    walk(NULL, 300);
    walk("{\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},"
         "\"b\":{\"enum\":[\"x\",\"y\"]}},\"required\":[\"b\",\"a\"]}}",
         200);
    walk("{\"type\":\"string\"}", 100);
}

static void test_min_len(void **state) {
    (void)state;
    ks_json_schema *s = compile(PERSON);
    char buf[256];
    ks_json_state st;
    ks_json_state_init(s, &st);
    size_t n = ks_json_state_finish(s, &st, buf, sizeof buf);
    assert_string_equal(buf, "{\"age\":0,\"name\":\"\"}"); /* the shortest missing key first */
    assert_int_equal(n, strlen(buf));
    assert_int_equal(ks_json_schema_min_len(s), n);
    ks_json_schema_destroy(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefixes),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_walks),
        cmocka_unit_test(test_min_len),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
