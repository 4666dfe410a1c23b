package fake

import "strings"

func (s *Server) sysInfo() *response {
	v := string(s.cfg.version)
	return syncResp(map[string]any{
		"series":         "16",
		"version":        v,
		"build-id":       "fakesnapd" + strings.ReplaceAll(v, ".", ""),
		"os-release":     map[string]string{"id": "debian", "version-id": "13"},
		"on-classic":     true,
		"managed":        false,
		"kernel-version": "6.0.0-fake",
		"locations":      map[string]string{"snap-mount-dir": "/snap", "snap-bin-dir": "/snap/bin"},
		"refresh":        map[string]string{"timer": "00:00~24:00/4"},
		"confinement":    "partial",
		"sandbox-features": map[string][]string{
			"confinement-options": {"classic", "devmode"},
		},
		"architecture":   "amd64",
		"virtualization": "none",
		"system-mode":    "run",
		"snapd-bin-from": "native-package",
		"features":       map[string]any{},
	})
}
