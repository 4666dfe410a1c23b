package fake

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
)

// Snap configuration as overlord/configstate/config keeps it: one JSON
// document per snap, dotted keys addressing nested objects ("a.b" is
// {"a":{"b":...}}), a null value in a patch removing the key.

// configKeyRe mirrors config.ParseKey (overlord/configstate/config/helpers.go):
// each part is lowercase letters, digits and dashes, starting with a letter
// or digit and not ending in a dash.
var configKeyRe = regexp.MustCompile(`^(?:[a-z0-9]+-?)*[a-z](?:-?[a-z0-9])*$`)

// parseConfigKey splits a dotted key; it fails as config.ParseKey does.
func parseConfigKey(key string) ([]string, error) {
	parts := strings.Split(key, ".")
	for _, p := range parts {
		if !configKeyRe.MatchString(p) {
			return nil, fmt.Errorf("invalid option name: %q", p)
		}
	}
	return parts, nil
}

// copyConfig deep-copies a configuration document (JSON round trip, so
// numbers become json.Number as snapd keeps them).
func copyConfig(m map[string]any) map[string]any {
	out := map[string]any{}
	if len(m) == 0 {
		return out
	}
	b, err := json.Marshal(m)
	if err != nil {
		panic(fmt.Sprintf("fake snapd: configuration is not JSON: %v", err))
	}
	d := json.NewDecoder(strings.NewReader(string(b)))
	d.UseNumber()
	d.Decode(&out)
	return out
}

// configGet returns the value at a dotted key.
func configGet(doc map[string]any, key string) (any, bool) {
	parts, err := parseConfigKey(key)
	if err != nil {
		return nil, false
	}
	var cur any = doc
	for _, p := range parts {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, false
		}
		if cur, ok = m[p]; !ok {
			return nil, false
		}
	}
	return cur, true
}

// configSet sets (or, for a nil value, removes) the value at a dotted key,
// creating intermediate objects and replacing non-object values in the way.
func configSet(doc map[string]any, key string, value any) {
	parts, err := parseConfigKey(key)
	if err != nil {
		return
	}
	m := doc
	for _, p := range parts[:len(parts)-1] {
		next, ok := m[p].(map[string]any)
		if !ok {
			if value == nil {
				return
			}
			next = map[string]any{}
			m[p] = next
		}
		m = next
	}
	last := parts[len(parts)-1]
	if value == nil {
		delete(m, last)
		return
	}
	m[last] = value
}
