/*
fields.h — a configuration field's descriptor and what every list of them is walked with: the
kinds of value (and their C types), parsing a value from its flag's text, formatting it back,
a choice's names, a field's flag. gpt.h declares the model's fields (GPT_CONFIG_FIELDS), config.h
the run's; the parser, --help, the checks, the checkpoint metadata and the Hugging Face config all
walk those lists through what is here.
*/
#pragma once
#include <errno.h>
#include <float.h>
#include <stddef.h>
#include <stdint.h>

// the kinds of value a config field holds, and their C types
typedef enum { FIELD_INT, FIELD_LONG, FIELD_FLOAT, FIELD_SWITCH, FIELD_CHOICE, FIELD_STRING, FIELD_INT3, FIELD_LIST } FieldKind;
#define MAX_LIST 512   // --data-path: up to 254 WEIGHT PREFIX pairs (data.c)
typedef struct { int v[3]; } IntTriple;
typedef struct { const char* v[MAX_LIST]; int count; } StringList;
#define CTYPE_INT int
#define CTYPE_LONG long long
#define CTYPE_FLOAT float
#define CTYPE_SWITCH int
#define CTYPE_CHOICE int   // the index of the value in the help text's "a | b | c" list
#define CTYPE_STRING const char*
#define CTYPE_INT3 IntTriple
#define CTYPE_LIST StringList
#define DECLARE_FIELD(kind, name, ...) CTYPE_##kind name;

// what a field is to a checkpoint (gpt.h's list: MATCH = the tensor layout depends on it, a resume
// must give the same value; STORED = written for the record, may change on resume)
typedef enum { MATCH, STORED, NOT_STORED } CheckpointRole;

// one field's descriptor: what every reader and writer of a config walks
typedef struct {
    const char *name, *default_value, *help, *hf_gpt2, *hf_bloom, *hf_llama;
    FieldKind kind;
    size_t offset;   // in its struct
    double min;
    CheckpointRole checkpoint;
} ConfigField;

static void* field_in(const ConfigField* f, void* base) { return (char*)base + f->offset; }

// "--name-with-dashes" of a field
static const char* flag_of(const ConfigField* f, char* buf, size_t len) {
    int n = snprintf(buf, len, "--%s", f->name);
    for (int i = 2; i < n && i < (int)len; i++)
        if (buf[i] == '_') buf[i] = '-';
    return buf;
}

// the k-th name of a choice field's "a | b | c" help text into out; 0 past the end (and for -1)
static int choice_name(const ConfigField* f, int k, char* out, size_t len) {
    const char* p = k < 0 ? NULL : f->help;   // -1: a choice with no default, not given
    for (; k > 0 && p; k--) {
        p = strstr(p, " | ");
        if (p) p += 3;
    }
    if (!p) return 0;
    snprintf(out, len, "%.*s", (int)strcspn(p, " "), p);
    return 1;
}

// Parse one value of a field (not of a list or a triple) from text. 0, or 1 with a line in err.
static int parse_field(const ConfigField* f, void* base, const char* text, char* err, size_t errlen) {
    char flag[96], *end = NULL, name[64];
    flag_of(f, flag, sizeof(flag));
    void* p = field_in(f, base);
    errno = 0;
    if (f->kind == FIELD_INT || f->kind == FIELD_LONG) {
        long long v = strtoll(text, &end, 10), most = f->kind == FIELD_INT ? INT32_MAX : INT64_MAX;
        if (end == text || *end || errno || v > most)
            return error_line(err, errlen, "%s expects an integer up to %lld, got '%s'", flag, most, text);
        if (v < f->min) return error_line(err, errlen, "%s must be at least %.0f, got %lld", flag, f->min, v);
        if (f->kind == FIELD_INT) *(int*)p = (int)v;
        else *(long long*)p = v;
    } else if (f->kind == FIELD_FLOAT) {
        float v = strtof(text, &end);
        if (end == text || *end || !isfinite(v)) return error_line(err, errlen, "%s expects a number, got '%s'", flag, text);
        if (errno == ERANGE)   // (1e-320 became 0: --loss-scale 1e-320 ran the dynamic scaler)
            return error_line(err, errlen, "%s %s: too small for a float (the least normal one is %g)", flag, text, FLT_MIN);
        if (v < f->min) return error_line(err, errlen, "%s must be at least %g, got %g", flag, f->min, v);
        *(float*)p = v;
    } else if (f->kind == FIELD_SWITCH) {
        *(int*)p = atoi(text) != 0;
    } else if (f->kind == FIELD_CHOICE) {
        int k = 0;
        while (choice_name(f, k, name, sizeof(name)) && strcmp(name, text) != 0) k++;
        if (!choice_name(f, k, name, sizeof(name)))
            return error_line(err, errlen, "%s must be one of %s, got '%s'", flag, f->help, text);
        *(int*)p = k;
    } else if (f->kind == FIELD_STRING) {
        *(const char**)p = text;
    }
    return 0;
}

// a field's value as text that parse_field reads back (a float in the fewest exact digits)
static const char* format_field(const ConfigField* f, const void* base, char* out, size_t len) {
    const void* p = (const char*)base + f->offset;
    out[0] = '\0';   // a list or a triple is not one value
    if (f->kind == FIELD_INT || f->kind == FIELD_SWITCH) snprintf(out, len, "%d", *(const int*)p);
    else if (f->kind == FIELD_LONG) snprintf(out, len, "%lld", *(const long long*)p);
    else if (f->kind == FIELD_CHOICE) choice_name(f, *(const int*)p, out, len);
    else if (f->kind == FIELD_STRING) snprintf(out, len, "%s", *(const char* const*)p ? *(const char* const*)p : "");
    else if (f->kind == FIELD_FLOAT)
        for (int digits = 6; digits <= 9; digits++) {
            snprintf(out, len, "%.*g", digits, *(const float*)p);
            if (strtof(out, NULL) == *(const float*)p) break;
        }
    return out;
}
