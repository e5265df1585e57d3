/*
json.h — a small JSON reader (RFC 8259), for the files of a Hugging Face model: config.json, the
safetensors header, the shard index (hf_import.h; hf.h reads an earlier export's config.json). A
document becomes an array of nodes; an array's or object's children follow each other through
`next`; strings (values and member names) are decoded into one pool, as UTF-8. A name given twice
in one object is refused (json_parse).
Small files are read whole through files.h's opener (read_small_file).

Its own room (out of hf.h) because it is one concern with a narrow interface: json_parse,
json_get, json_str, json_uint, json_type_name, json_free, read_small_file.
*/
#pragma once

typedef enum { JSON_NULL, JSON_FALSE, JSON_TRUE, JSON_NUMBER, JSON_STRING, JSON_ARRAY, JSON_OBJECT } JsonType;
#define JSON_MAX_DEPTH 64

typedef struct {
    JsonType type;
    int key;               // a member of an object: its name's offset in the pool; else -1
    int str;               // a string: its offset in the pool
    double number;
    const char* text;      // a number: its text in the document (exact integers are read from it)
    int text_len;
    int child, next;       // the first child (array, object) and the next sibling; -1: none
} JsonNode;

typedef struct {
    JsonNode* nodes;
    int count, cap;
    char* pool;
    size_t pool_len, pool_cap;
    const char *start, *p, *end;   // the document and where the parser is
    const char* why;               // the first error (NULL: none)
} Json;

static int json_fail(Json* j, const char* why) {
    if (!j->why) j->why = why;
    return -1;
}

static int json_new(Json* j, JsonType type) {
    if (j->count == j->cap) j->nodes = (JsonNode*)reallocCheck(j->nodes, (j->cap = j->cap ? 2 * j->cap : 256) * sizeof(JsonNode));
    JsonNode* n = &j->nodes[j->count];
    memset(n, 0, sizeof(*n));
    n->type = type;
    n->key = n->str = n->child = n->next = -1;
    return j->count++;
}

static void json_skip_space(Json* j) { j->p = skip_json_space(j->p, j->end); }   // tokenizer.h's

// the string whose opening quote is at j->p, decoded into the pool: its offset, or -1
static int json_string(Json* j) {
    size_t at = j->pool_len;
    for (j->p++; j->p < j->end && *j->p != '"';) {
        if (j->pool_len + 5 > j->pool_cap) j->pool = (char*)reallocCheck(j->pool, j->pool_cap = 2 * j->pool_cap + 256);
        unsigned char c = (unsigned char)*j->p;
        if (c < 0x20) return json_fail(j, "a control character in a string");
        if (c != '\\') {
            j->pool[j->pool_len++] = (char)c;
            j->p++;
            continue;
        }
        const char* why;
        j->p++;
        long cp = json_escape(&j->p, j->end, &why);   // tokenizer.h's, the vocabulary's reader
        if (cp < 0) return json_fail(j, why);
        if (cp == 0) return json_fail(j, "a \\u0000 in a string");   // (names are C strings)
        j->pool_len += utf8_put(j->pool + j->pool_len, (uint32_t)cp);
    }
    if (j->p >= j->end) return json_fail(j, "an unterminated string");
    if (j->pool_len + 1 > j->pool_cap) j->pool = (char*)reallocCheck(j->pool, j->pool_cap = 2 * j->pool_cap + 256);
    j->pool[j->pool_len++] = '\0';
    j->p++;
    return (int)at;
}

static int json_digits(const char** q, const char* end) {
    const char* s = *q;
    while (*q < end && **q >= '0' && **q <= '9') ++*q;
    return *q > s;
}

// -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
static int json_number(Json* j) {
    const char *s = j->p, *q = s;
    if (q < j->end && *q == '-') q++;
    if (q < j->end && *q == '0') q++;
    else if (!json_digits(&q, j->end)) return json_fail(j, "a malformed number");
    if (q < j->end && *q == '.' && (++q, !json_digits(&q, j->end))) return json_fail(j, "a malformed number");
    if (q < j->end && (*q == 'e' || *q == 'E')) {
        q++;
        if (q < j->end && (*q == '+' || *q == '-')) q++;
        if (!json_digits(&q, j->end)) return json_fail(j, "a malformed number");
    }
    char text[64];
    if (q - s >= (long)sizeof(text)) return json_fail(j, "a number of more than 63 characters");
    memcpy(text, s, q - s);
    text[q - s] = '\0';
    int n = json_new(j, JSON_NUMBER);
    j->nodes[n].number = strtod(text, NULL);
    j->nodes[n].text = s;
    j->nodes[n].text_len = (int)(q - s);
    j->p = q;
    return n;
}

static int json_value(Json* j, int depth);

// an array or an object at j->p
static int json_container(Json* j, int depth) {
    int object = *j->p == '{', node = json_new(j, object ? JSON_OBJECT : JSON_ARRAY), last = -1;
    char close = object ? '}' : ']';
    j->p++;
    json_skip_space(j);
    if (j->p < j->end && *j->p == close) return j->p++, node;
    for (;;) {
        int key = -1;
        if (object) {
            json_skip_space(j);
            if (j->p >= j->end || *j->p != '"') return json_fail(j, "expected a member's name");
            if ((key = json_string(j)) < 0) return -1;
            json_skip_space(j);
            if (j->p >= j->end || *j->p != ':') return json_fail(j, "expected ':' after a member's name");
            j->p++;
        }
        int child = json_value(j, depth + 1);
        if (child < 0) return -1;
        j->nodes[child].key = key;
        if (last < 0) j->nodes[node].child = child;
        else j->nodes[last].next = child;
        last = child;
        json_skip_space(j);
        if (j->p < j->end && *j->p == ',') j->p++;
        else if (j->p < j->end && *j->p == close) return j->p++, node;
        else return json_fail(j, object ? "expected ',' or '}'" : "expected ',' or ']'");
    }
}

static int json_value(Json* j, int depth) {
    static const char* const LITERALS[3] = {"null", "false", "true"};
    json_skip_space(j);
    if (j->p >= j->end) return json_fail(j, "the text ends where a value was expected");
    if (depth > JSON_MAX_DEPTH) return json_fail(j, "values nested more than 64 deep");
    if (*j->p == '{' || *j->p == '[') return json_container(j, depth);
    if (*j->p == '"') {
        int n = json_new(j, JSON_STRING), s = json_string(j);
        return s < 0 ? -1 : (j->nodes[n].str = s, n);
    }
    if (*j->p == '-' || (*j->p >= '0' && *j->p <= '9')) return json_number(j);
    for (int k = 0; k < 3; k++) {
        size_t len = strlen(LITERALS[k]);
        if ((size_t)(j->end - j->p) >= len && !memcmp(j->p, LITERALS[k], len)) {
            j->p += len;
            return json_new(j, (JsonType)(JSON_NULL + k));
        }
    }
    return json_fail(j, "an unexpected character");
}

static const Json* json_sorting;   // (qsort has no context argument)
static int json_by_name(const void* a, const void* b) {
    const Json* j = json_sorting;
    return strcmp(j->pool + j->nodes[*(const int*)a].key, j->pool + j->nodes[*(const int*)b].key);
}

// The first name given twice in one object, or NULL. Such a file is refused: JSON leaves which
// of the two counts to the reader, and readers differ (Python's json, so transformers, takes the
// last; json_get, the first). Taking the last would agree with transformers, but not with every
// other tool that reads the file, nor with a person reading it from the top; so the file is
// refused, and the fix is one deleted line. (Each object's names sorted: N log N for any file.)
static const char* json_repeated_name(const Json* j) {
    int* members = (int*)mallocCheck((j->count + 1) * sizeof(int));
    const char* repeated = NULL;
    json_sorting = j;
    for (int o = 0; o < j->count && !repeated; o++) {
        int n = 0;
        for (int c = j->nodes[o].type == JSON_OBJECT ? j->nodes[o].child : -1; c >= 0; c = j->nodes[c].next) members[n++] = c;
        qsort(members, n, sizeof(int), json_by_name);
        for (int i = 1; i < n && !repeated; i++)
            if (!json_by_name(&members[i - 1], &members[i])) repeated = j->pool + j->nodes[members[i]].key;
    }
    free(members);
    return repeated;
}

// Parse text[0, len): the root node (0), or -1 with a line in err naming path and the byte (or
// the name given twice). The nodes point into text (numbers' text): keep it while j is used;
// json_free frees j.
static int json_parse(Json* j, const char* text, size_t len, const char* path, char* err, size_t errlen) {
    memset(j, 0, sizeof(*j));
    j->start = j->p = text;
    j->end = text + len;
    int root = json_value(j, 0);
    json_skip_space(j);
    if (root >= 0 && j->p < j->end) root = json_fail(j, "more text after the value");
    if (root < 0) return error_line(err, errlen, "%s: not JSON: %s at byte %zu", path, j->why, (size_t)(j->p - j->start)), -1;
    const char* twice = json_repeated_name(j);
    if (twice)
        return error_line(err, errlen, "%s: \"%.200s\" is given twice in one object, and readers differ on which counts "
                          "(transformers takes the last, others the first): keep one", path, twice), -1;
    return root;
}

static void json_free(Json* j) {
    free(j->nodes);
    free(j->pool);
    memset(j, 0, sizeof(*j));
}

// the member `key` of object node obj, or -1 (names are unique: json_parse)
static int json_get(const Json* j, int obj, const char* key) {
    if (obj < 0 || j->nodes[obj].type != JSON_OBJECT) return -1;
    for (int c = j->nodes[obj].child; c >= 0; c = j->nodes[c].next)
        if (!strcmp(j->pool + j->nodes[c].key, key)) return c;
    return -1;
}

static const char* json_str(const Json* j, int n) { return n >= 0 && j->nodes[n].type == JSON_STRING ? j->pool + j->nodes[n].str : NULL; }
static const char* json_key(const Json* j, int n) { return j->pool + j->nodes[n].key; }

// a non-negative integer written as digits only, below 2^62, into *v: 0, or 1 when it is not one
static int json_uint(const Json* j, int n, uint64_t* v) {
    if (n < 0 || j->nodes[n].type != JSON_NUMBER) return 1;
    const JsonNode* x = &j->nodes[n];
    *v = 0;
    for (int i = 0; i < x->text_len; i++) {
        if (x->text[i] < '0' || x->text[i] > '9' || *v >= ((uint64_t)1 << 58)) return 1;
        *v = 10 * *v + (uint64_t)(x->text[i] - '0');
    }
    return 0;
}

static const char* json_type_name(const Json* j, int n) {
    static const char* const NAMES[7] = {"null", "false", "true", "a number", "a string", "an array", "an object"};
    return n < 0 ? "absent" : NAMES[j->nodes[n].type];
}

// a small file whole (config.json, the index) into a malloc'd buffer; NULL with a line in err.
// files.h opens it: a FIFO, a directory or a device is refused, not waited on.
static char* read_small_file(const char* path, size_t most, size_t* len, char* err, size_t errlen) {
    int fd = open_regular_file(path, err, errlen);
    struct stat st;
    if (fd < 0) return NULL;
    int refused = fstat(fd, &st) != 0 ? error_line(err, errlen, "%s: %s", path, strerror(errno))
                : (size_t)st.st_size > most ? error_line(err, errlen, "%s: %lld bytes, more than the %zu expected of it",
                                                         path, (long long)st.st_size, most) : 0;
    if (refused) {
        close(fd);
        return NULL;
    }
    char* text = (char*)mallocCheck(st.st_size + 1);
    ssize_t got = read(fd, text, st.st_size);
    close(fd);
    if (got != st.st_size) {
        free(text);
        error_line(err, errlen, "%s: cannot read it: %s", path, got < 0 ? strerror(errno) : "short read");
        return NULL;
    }
    text[got] = '\0';
    *len = (size_t)got;
    return text;
}
