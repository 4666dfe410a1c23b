package snapsvc

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"
)

// Errors for bad input, returned before any request is sent.
var (
	// ErrNoNames: an operation named no services.
	ErrNoNames = errors.New("no services named")
	// ErrInvalidName: a name is not "snap" or "snap.app" by snapd's rules.
	ErrInvalidName = errors.New("invalid service name")
	// ErrWrongSnap: from inside a snap, a name belongs to another snap
	// (snapctl only controls the calling snap's own services).
	ErrWrongSnap = errors.New("service of another snap")
)

// Name rules from snapd's snap/naming package (ValidateSnap, ValidateApp,
// ValidateInstance): a snap name is 2–40 characters of lower-case letters,
// digits and single hyphens, with at least one letter and no hyphen at
// either end, optionally followed by an instance key "_" + 1–10
// lower-case letters or digits; an app name is letters, digits and single
// inner hyphens.
var (
	reSnapName    = regexp.MustCompile(`^(?:[a-z0-9]+-?)*[a-z](?:-?[a-z0-9])*$`)
	reInstanceKey = regexp.MustCompile(`^[a-z0-9]{1,10}$`)
	reAppName     = regexp.MustCompile(`^[a-zA-Z0-9](?:-?[a-zA-Z0-9])*$`)
)

// ValidateName checks that name is "snap" or "snap.app" by snapd's naming
// rules and returns the snap and the app ("" for a whole snap).
func ValidateName(name string) (snap, app string, err error) {
	snap, app, hasApp := strings.Cut(name, ".")
	if hasApp && app == "" {
		return "", "", fmt.Errorf("%w %q: empty app name after the dot", ErrInvalidName, name)
	}
	if hasApp && snap == "" {
		return "", "", fmt.Errorf("%w %q: no snap name before the dot (want \"snap\" or \"snap.app\")", ErrInvalidName, name)
	}
	if err := validateSnapName(snap); err != nil {
		return "", "", fmt.Errorf("%w %q: %v", ErrInvalidName, name, err)
	}
	if hasApp && !reAppName.MatchString(app) {
		return "", "", fmt.Errorf("%w %q: app name %q must be letters, digits and inner hyphens", ErrInvalidName, name, app)
	}
	return snap, app, nil
}

func validateSnapName(instance string) error {
	name, key, hasKey := strings.Cut(instance, "_")
	if len(name) < 2 || len(name) > 40 {
		return fmt.Errorf("snap name %q must be 2 to 40 characters", name)
	}
	if !reSnapName.MatchString(name) {
		return fmt.Errorf("snap name %q must be lower-case letters, digits and inner hyphens, with a letter", name)
	}
	if hasKey && !reInstanceKey.MatchString(key) {
		return fmt.Errorf("instance key %q must be 1 to 10 lower-case letters or digits", key)
	}
	return nil
}

// target is a validated operation target: the names as given, each once
// (snapd keeps a repeated name in its task summaries, which would then no
// longer match the change a lost answer is looked up by), and the snaps
// they touch, sorted and unique.
type target struct {
	names []string
	snaps []string
}

// validateNames checks every name (ValidateName) and returns the first
// failure.
func validateNames(names []string) error {
	for _, n := range names {
		if _, _, err := ValidateName(n); err != nil {
			return err
		}
	}
	return nil
}

func parseTarget(names []string) (target, error) {
	if len(names) == 0 {
		return target{}, ErrNoNames
	}
	seen := map[string]bool{}
	var t target
	for _, n := range names {
		snap, _, err := ValidateName(n)
		if err != nil {
			return target{}, err
		}
		if slices.Contains(t.names, n) {
			continue
		}
		t.names = append(t.names, n)
		if !seen[snap] {
			seen[snap] = true
			t.snaps = append(t.snaps, snap)
		}
	}
	sort.Strings(t.snaps)
	return t, nil
}

func (t target) String() string { return strings.Join(t.names, ",") }
