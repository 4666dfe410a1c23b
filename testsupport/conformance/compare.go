package conformance

import (
	"encoding/json"
	"fmt"
	"reflect"
	"regexp"
	"sort"
	"strings"
)

// Keys whose values differ from run to run: ids and timestamps. Their
// presence and JSON type still have to match.
var volatileKeys = map[string]bool{
	"id": true, "change": true, "spawn-time": true, "ready-time": true,
	"first-occurred": true, "last-occurred": true, "last-repeated": true,
	"build-id": true,
}

// Compare reports the structural differences between a golden body and an
// actual one: same keys recursively, same JSON types, same values — except
// for ids and timestamps (volatileKeys), the text of task log entries (only
// their number and level are compared), and notice keys (change ids).
// Lists of changes (GET /v2/changes is unordered in snapd) are compared as
// multisets.
func Compare(golden, actual []byte) []string {
	var g, a any
	if err := json.Unmarshal(golden, &g); err != nil {
		return []string{fmt.Sprintf("golden is not JSON: %v", err)}
	}
	if err := json.Unmarshal(actual, &a); err != nil {
		return []string{fmt.Sprintf("actual is not JSON: %v: %q", err, actual)}
	}
	var diffs []string
	compareValue("$", "", g, a, &diffs)
	return diffs
}

func typeName(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case map[string]any:
		return "object"
	case []any:
		return "array"
	case string:
		return "string"
	case float64:
		return "number"
	case bool:
		return "bool"
	}
	return fmt.Sprintf("%T", v)
}

func compareValue(path, key string, g, a any, diffs *[]string) {
	if typeName(g) != typeName(a) {
		*diffs = append(*diffs, fmt.Sprintf("%s: type %s, want %s (%v vs golden %v)", path, typeName(a), typeName(g), short(a), short(g)))
		return
	}
	if volatileKeys[key] || (key == "key" && isDigits(g)) {
		return
	}
	switch gv := g.(type) {
	case map[string]any:
		av := a.(map[string]any)
		var keys []string
		for k := range gv {
			keys = append(keys, k)
		}
		for k := range av {
			if _, ok := gv[k]; !ok {
				keys = append(keys, k)
			}
		}
		sort.Strings(keys)
		for _, k := range keys {
			gx, gok := gv[k]
			ax, aok := av[k]
			switch {
			case !aok:
				*diffs = append(*diffs, fmt.Sprintf("%s: missing key %q (golden %v)", path, k, short(gx)))
			case !gok:
				*diffs = append(*diffs, fmt.Sprintf("%s: extra key %q (%v)", path, k, short(ax)))
			default:
				compareValue(path+"."+k, k, gx, ax, diffs)
			}
		}
	case []any:
		av := a.([]any)
		if len(gv) != len(av) {
			*diffs = append(*diffs, fmt.Sprintf("%s: %d elements, want %d", path, len(av), len(gv)))
			return
		}
		if key == "log" {
			for i := range gv {
				if logLevel(gv[i]) != logLevel(av[i]) {
					*diffs = append(*diffs, fmt.Sprintf("%s[%d]: log level %q, want %q", path, i, logLevel(av[i]), logLevel(gv[i])))
				}
			}
			return
		}
		if key == "result" && isChangeList(gv) {
			gv, av = sortChanges(gv), sortChanges(av)
		}
		for i := range gv {
			compareValue(fmt.Sprintf("%s[%d]", path, i), "", gv[i], av[i], diffs)
		}
	case string:
		if normalise(gv) != normalise(a.(string)) {
			*diffs = append(*diffs, fmt.Sprintf("%s: %s, want %s", path, short(a), short(g)))
		}
	default:
		if !reflect.DeepEqual(g, a) {
			*diffs = append(*diffs, fmt.Sprintf("%s: %s, want %s", path, short(a), short(g)))
		}
	}
}

// localInstall is the random name of a sideloaded snap file.
var localInstall = regexp.MustCompile(`\.local-install-[0-9]+`)

func normalise(s string) string { return localInstall.ReplaceAllString(s, ".local-install-N") }

func isDigits(v any) bool {
	s, ok := v.(string)
	if !ok || s == "" {
		return false
	}
	return strings.Trim(s, "0123456789") == ""
}

// logLevel extracts INFO/ERROR from "<RFC3339> LEVEL text".
func logLevel(v any) string {
	s, _ := v.(string)
	f := strings.SplitN(s, " ", 3)
	if len(f) < 2 {
		return s
	}
	return f[1]
}

func isChangeList(l []any) bool {
	for _, e := range l {
		m, ok := e.(map[string]any)
		if !ok {
			return false
		}
		if _, ok := m["kind"]; !ok {
			return false
		}
		if _, ok := m["ready"]; !ok {
			return false
		}
	}
	return true
}

// changeSignature identifies a change independently of ids and times.
func changeSignature(v any) string {
	m, _ := v.(map[string]any)
	sig := fmt.Sprint(m["kind"], "|", m["summary"], "|", m["status"])
	if ts, ok := m["tasks"].([]any); ok {
		for _, t := range ts {
			tm, _ := t.(map[string]any)
			sig += fmt.Sprint("|", tm["kind"], ":", tm["summary"], ":", tm["status"], ":", len(asList(tm["log"])))
		}
	}
	return sig
}

func asList(v any) []any { l, _ := v.([]any); return l }

func sortChanges(l []any) []any {
	out := append([]any(nil), l...)
	sort.SliceStable(out, func(i, j int) bool { return changeSignature(out[i]) < changeSignature(out[j]) })
	return out
}

func short(v any) string {
	b, _ := json.Marshal(v)
	s := string(b)
	if len(s) > 160 {
		s = s[:160] + "..."
	}
	return s
}
