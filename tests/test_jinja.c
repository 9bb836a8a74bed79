/*
 * test_jinja.c — the chat-template interpreter (src/template/jinja.c)
 * against the reference renderer, byte for byte.
 *
 * tests/fixtures/templates/goldens.json holds, for every published template
 * in that directory, a few conversations (system + multi-turn, unicode and
 * whitespace, thinking tags; add_generation_prompt on and off) and what
 * Python jinja2 renders for them as transformers configures it
 * (tools/jinja_goldens.py), or the error it raises.  One test per template
 * (built from the goldens' keys), so a regression names the model.  Then the constructs one at a
 * time, and bad templates: each is a clean status, never a crash.
 */
#include "testutil.h"
#include "template/jinja.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static cJSON *goldens;

static int load_goldens(void **state) {
    (void)state;
    size_t n;
    char *txt = ks_test_read_file(ks_test_fixture("templates/goldens.json"), &n);
    if (!txt) return -1;
    goldens = cJSON_ParseWithLength(txt, n);
    free(txt);
    return goldens ? 0 : -1;
}

static int free_goldens(void **state) {
    (void)state;
    cJSON_Delete(goldens);
    return 0;
}

static void check_template(const char *name) {
    char rel[256];
    snprintf(rel, sizeof rel, "templates/%s.jinja", name);
    size_t len;
    char *src = ks_test_read_file(ks_test_fixture(rel), &len);
    assert_non_null(src);
    ks_jinja *t = NULL;
    ks_status st = ks_jinja_parse(src, len, &t);
    if (st != KS_OK) fail_msg("%s: %s", name, ks_last_error());
    const cJSON *cases = cJSON_GetObjectItemCaseSensitive(goldens, name);
    assert_true(cJSON_GetArraySize(cases) > 0);
    int64_t now = (int64_t)cJSON_GetObjectItemCaseSensitive(goldens, "now")->valuedouble;
    const cJSON *c;
    cJSON_ArrayForEach(c, cases) {
        const char *cname = cJSON_GetObjectItemCaseSensitive(c, "name")->valuestring;
        char *vars = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(c, "vars"));
        char *out = NULL;
        size_t n_out = 0;
        st = ks_jinja_render(t, vars, strlen(vars), now, &out, &n_out);
        const cJSON *exp = cJSON_GetObjectItemCaseSensitive(c, "expected");
        if (exp) {
            if (st != KS_OK) fail_msg("%s %s: %s", name, cname, ks_last_error());
            size_t ne = strlen(exp->valuestring);
            if (n_out != ne || memcmp(out, exp->valuestring, ne) != 0) {
                size_t i = 0;
                while (i < n_out && i < ne && out[i] == exp->valuestring[i]) i++;
                fail_msg("%s %s: differs at byte %zu\n--- got:\n%s\n--- expected:\n%s", name, cname, i, out,
                         exp->valuestring);
            }
        } else {
            /* the reference raised: so must we, with its message */
            const char *msg = cJSON_GetObjectItemCaseSensitive(c, "error")->valuestring;
            if (st == KS_OK) fail_msg("%s %s: rendered, the reference raised '%s'", name, cname, msg);
            assert_int_equal(st, KS_ERR_INVALID_ARG);
            if (!strstr(ks_last_error(), msg)) fail_msg("%s %s: error '%s' lacks '%s'", name, cname, ks_last_error(), msg);
        }
        ks_free(out);
        cJSON_free(vars);
    }
    ks_jinja_destroy(t);
    free(src);
}

/* One cmocka test per template of the goldens, named after it. */
static void test_template(void **state) { check_template((const char *)*state); }

/* Render src with vars; returns the ks_malloc'd text or NULL (status in *st). */
static char *render(const char *src, const char *vars, ks_status *st) {
    ks_jinja *t = NULL;
    *st = ks_jinja_parse(src, strlen(src), &t);
    if (*st != KS_OK) return NULL;
    char *out = NULL;
    size_t n;
    *st = ks_jinja_render(t, vars, strlen(vars), 0, &out, &n);
    ks_jinja_destroy(t);
    return *st == KS_OK ? out : NULL;
}

static void expect(const char *src, const char *vars, const char *want) {
    ks_status st;
    char *out = render(src, vars, &st);
    if (!out) fail_msg("%s: %s", src, ks_last_error());
    if (strcmp(out, want) != 0) fail_msg("%s\n got: [%s]\nwant: [%s]", src, out, want);
    ks_free(out);
}

static void test_constructs(void **state) {
    (void)state;
    expect("{{ 1 + 2 * 3 }}|{{ 7 // 2 }}|{{ -7 % 3 }}|{{ 1 / 2 }}|{{ 4 / 2 }}|{{ 2 ** 10 }}", "{}", "7|3|2|0.5|2.0|1024");
    expect("{{ 'a' ~ 1 ~ none ~ true }}|{{ 'x' + 'y' }}|{{ 'ab' * 3 }}", "{}", "a1NoneTrue|xy|ababab");
    expect("{{ [1, 'a', {'b': none}] }}|{{ {'k': [1.5, false]} | tojson }}", "{}",
           "[1, 'a', {'b': None}]|{\"k\": [1.5, false]}");
    expect("{{ x | tojson(indent=2) }}", "{\"x\":{\"a\":[1,2],\"b\":\"é\\n\"}}",
           "{\n  \"a\": [\n    1,\n    2\n  ],\n  \"b\": \"é\\n\"\n}");
    expect("{{ 'héllo'[1:] }}|{{ 'abc'[::-1] }}|{{ [1,2,3,4][-2:] }}|{{ 'héllo' | length }}", "{}",
           "éllo|cba|[3, 4]|5");
    expect("{% for a, b in x.items() %}{{ a }}={{ b }}{% if not loop.last %},{% endif %}{% endfor %}",
           "{\"x\":{\"p\":1,\"q\":2}}", "p=1,q=2");
    expect("{% for i in range(5) if i is odd %}{{ loop.index0 }}{{ i }}{% else %}none{% endfor %}", "{}", "0113");
    expect("{% for i in [] %}x{% else %}empty{% endfor %}", "{}", "empty");
    expect("{% for i in range(9) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 4 %}{% break %}{% endif %}{{ i }}{% endfor %}",
           "{}", "013");
    expect("{% set ns = namespace(n=0) %}{% for i in range(3) %}{% set ns.n = ns.n + i %}{% set y = 9 %}{% endfor %}"
           "{{ ns.n }}{{ y is defined }}",
           "{}", "3False");
    expect("{% if x is none %}n{% elif x is string %}s{% else %}o{% endif %}", "{\"x\":\"q\"}", "s");
    expect("{{ ' a b '.strip() }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'abc'.startswith('ab') }}"
           "|{{ 'abc'.endswith(('x', 'c')) }}|{{ 'aXbX'.replace('X', '-') }}|{{ 'Hi'.upper() }}{{ 'Hi' | lower }}",
           "{}", "a b|['a', 'b', '', 'c']|['a', 'b']|True|True|a-b-|HIhi");
    expect("{{ x | default('d') }}|{{ '' | default('d', true) }}|{{ y.get('k', 3) }}|{{ 'k' in y }}|{{ 'z' not in y }}",
           "{\"y\":{\"k\":1}}", "d|d|1|True|True");
    expect("{% macro m(a, b='B') %}<{{ a }}{{ b }}>{% endmacro %}{{ m(1) }}{{ m(2, b='c') }}", "{}", "<1B><2c>");
    expect("{% set s %}in{{ 1 }}{% endset %}[{{ s }}]", "{}", "[in1]");
    expect("{{ 'yes' if x else 'no' }}|{{ x and 1 or 2 }}", "{\"x\":0}", "no|2");
    expect("{{ xs | selectattr('r', 'equalto', 'u') | map(attribute='c') | join(',') }}|{{ xs | first }}",
           "{\"xs\":[{\"r\":\"u\",\"c\":\"a\"},{\"r\":\"s\",\"c\":\"b\"},{\"r\":\"u\",\"c\":\"c\"}]}",
           "a,c|{'r': 'u', 'c': 'a'}");
    /* whitespace control: trim_blocks, lstrip_blocks, and the dashes */
    expect("a\n  {% if true %}\n  b\n  {% endif %}\nc", "{}", "a\n  b\nc");
    expect("a  {%- if true -%}  b  {%- endif %}  c\n", "{}", "ab  c");
    expect("{# comment #}\nx{{- ' y ' -}}\nz", "{}", "x y z");
    expect("{{ 0.1 + 0.2 }}|{{ 1e20 }}|{{ 1.0 }}|{{ 3.0e-5 }}", "{}", "0.30000000000000004|1e+20|1.0|3e-05");
}

static void bad(const char *src, const char *vars, ks_status want) {
    ks_status st;
    char *out = render(src, vars, &st);
    if (out) fail_msg("%s rendered [%s]", src, out);
    if (st != want) fail_msg("%s: status %d (%s), want %d", src, (int)st, ks_last_error(), (int)want);
}

static void test_errors(void **state) {
    (void)state;
    bad("{% if x %}", "{}", KS_ERR_FORMAT);
    bad("{% for %}", "{}", KS_ERR_FORMAT);
    bad("{{ 1 + }}", "{}", KS_ERR_FORMAT);
    bad("{{ 'abc }}", "{}", KS_ERR_FORMAT);
    bad("{% endif %}", "{}", KS_ERR_FORMAT);
    bad("{% include 'x' %}", "{}", KS_ERR_FORMAT);
    bad("{{ x", "{}", KS_ERR_FORMAT);
    bad("{{ x.y.z }}", "{}", KS_ERR_FORMAT);
    bad("{{ 1 / 0 }}", "{}", KS_ERR_FORMAT);
    bad("{{ 'a' + 1 }}", "{}", KS_ERR_FORMAT);
    bad("{{ x | nosuchfilter }}", "{}", KS_ERR_FORMAT);
    bad("{{ raise_exception('no system role') }}", "{}", KS_ERR_INVALID_ARG);
    bad("{{ x }}", "[1]", KS_ERR_INVALID_ARG);
    bad("{{ x }}", "{", KS_ERR_INVALID_ARG);
    bad("{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}", "{}", KS_ERR_FORMAT);
    bad("{% for i in range(1000000) %}{% for j in range(1000000) %}{% endfor %}{% endfor %}", "{}", KS_ERR_FORMAT);
    bad("{% set s = 'x' * 1000000 %}{% for i in range(100) %}{{ s }}{% endfor %}", "{}", KS_ERR_FORMAT);
    /* values nested without bound: an error, not a stack overflow */
    bad("{% set ns = namespace(x=[]) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x }}",
        "{}", KS_ERR_FORMAT);
    bad("{% set ns = namespace(x=[]) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x | tojson }}",
        "{}", KS_ERR_FORMAT);
    /* deep nesting is a parse error, not a stack overflow */
    char deep[4096];
    size_t k = 0;
    k += (size_t)snprintf(deep + k, sizeof deep - k, "{{ ");
    for (int i = 0; i < 1000; i++) deep[k++] = '(';
    deep[k++] = '1';
    for (int i = 0; i < 1000; i++) deep[k++] = ')';
    snprintf(deep + k, sizeof deep - k, " }}");
    bad(deep, "{}", KS_ERR_FORMAT);
}

int main(void) {
    if (load_goldens(NULL) != 0) {
        fprintf(stderr, "cannot read %s\n", ks_test_fixture("templates/goldens.json"));
        return 1;
    }
    int n = 0;
    const cJSON *g;
    cJSON_ArrayForEach(g, goldens) n += cJSON_IsArray(g);
    struct CMUnitTest *tests = calloc((size_t)n + 2, sizeof *tests);
    int k = 0;
    cJSON_ArrayForEach(g, goldens) {
        if (!cJSON_IsArray(g)) continue;
        tests[k++] = (struct CMUnitTest){g->string, test_template, NULL, NULL, g->string};
    }
    tests[k++] = (struct CMUnitTest)cmocka_unit_test(test_constructs);
    tests[k++] = (struct CMUnitTest)cmocka_unit_test(test_errors);
    int rc = _cmocka_run_group_tests("test_jinja", tests, (size_t)k, NULL, NULL);
    free(tests);
    free_goldens(NULL);
    return rc;
}
