package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/snapsvc/snapsvc/snapsvc"
)

// printJSON writes v as indented JSON on stdout.
func (a *app) printJSON(v any) {
	enc := json.NewEncoder(a.stdout)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// table returns a tab writer on stdout; call Flush when done.
func (a *app) table() *tabwriter.Writer {
	return tabwriter.NewWriter(a.stdout, 5, 3, 2, ' ', 0) // snap's tabWriter (cmd/snap/main.go)
}

// currentTask is the task a change is working on: the first Doing (or
// Undoing/Abort) task, else the first waiting one, else the last.
func currentTask(chg *snapsvc.Change) *snapsvc.Task {
	if len(chg.Tasks) == 0 {
		return nil
	}
	for _, want := range [][]string{{"Doing", "Undoing", "Abort"}, {"Do", "Undo", "Wait"}} {
		for i := range chg.Tasks {
			for _, st := range want {
				if chg.Tasks[i].Status == st {
					return &chg.Tasks[i]
				}
			}
		}
	}
	return &chg.Tasks[len(chg.Tasks)-1]
}

// describeChange is a one-line account of what a change is doing.
func describeChange(chg *snapsvc.Change) string {
	s := fmt.Sprintf("change %s (%s) %s", chg.ID, chg.Kind, chg.Status)
	t := currentTask(chg)
	if t == nil || chg.Ready {
		return s + ": " + chg.Summary
	}
	s += ": " + t.Summary
	if t.Progress.Label != "" && t.Progress.Total > 1 {
		s += fmt.Sprintf(" [%s %d/%d]", t.Progress.Label, t.Progress.Done, t.Progress.Total)
	}
	if n := len(t.Log); n > 0 {
		s += " — " + logText(t.Log[n-1])
	}
	return s
}

// logText strips the timestamp snapd puts before each task log line
// ("2024-01-02T03:04:05Z INFO text").
func logText(line string) string {
	parts := strings.SplitN(line, " ", 3)
	if len(parts) == 3 {
		if _, err := time.Parse(time.RFC3339, parts[0]); err == nil {
			return parts[1] + " " + parts[2]
		}
	}
	return line
}
