package etcdbudget_test

import (
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/etcdbudget"
)

func TestWindowContainsAndNext(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Skip("no tzdata:", err)
	}
	at := func(s string) time.Time {
		tm, err := time.ParseInLocation("2006-01-02 15:04", s, berlin)
		if err != nil {
			t.Fatal(err)
		}
		return tm
	}
	// 2026-12-04 is a Friday.
	for _, tc := range []struct {
		spec, now string
		in        bool
		next      string
	}{
		{"Mon-Fri 22:00-04:00 Europe/Berlin", "2026-12-04 21:59", false, "2026-12-04 22:00"},
		{"Mon-Fri 22:00-04:00 Europe/Berlin", "2026-12-04 23:30", true, "2026-12-04 23:30"},
		{"Mon-Fri 22:00-04:00 Europe/Berlin", "2026-12-05 03:59", true, "2026-12-05 03:59"}, // Saturday morning: Friday's window
		{"Mon-Fri 22:00-04:00 Europe/Berlin", "2026-12-05 04:00", false, "2026-12-07 22:00"},
		{"Mon-Fri 22:00-04:00 Europe/Berlin", "2026-12-07 01:00", false, "2026-12-07 22:00"}, // Monday 1am: Sunday has no window
		{"Sat,Sun 00:00-24:00 Europe/Berlin", "2026-12-04 12:00", false, "2026-12-05 00:00"},
		{"Sat,Sun 00:00-24:00 Europe/Berlin", "2026-12-06 23:59", true, "2026-12-06 23:59"},
		{"daily 01:00-05:00 Europe/Berlin", "2026-12-04 05:00", false, "2026-12-05 01:00"},
		{"fri-mon 10:00-11:00 Europe/Berlin", "2026-12-08 10:30", false, "2026-12-11 10:00"}, // Tuesday
		// DST: 2027-03-28 02:00 does not exist in Berlin; the opening is 03:00 CEST.
		{"Sun 02:30-04:00 Europe/Berlin", "2027-03-28 01:00", false, "2027-03-28 03:30"},
	} {
		w, err := etcdbudget.ParseWindow(tc.spec)
		if err != nil {
			t.Fatal(err)
		}
		now := at(tc.now)
		if got := w.Contains(now); got != tc.in {
			t.Errorf("%s: Contains(%s) = %v", tc.spec, tc.now, got)
		}
		if got, want := w.Next(now), at(tc.next); !got.Equal(want) {
			t.Errorf("%s: Next(%s) = %s, want %s", tc.spec, tc.now, got.In(berlin), want)
		}
	}
}

func TestParseWindow(t *testing.T) {
	w, err := etcdbudget.ParseWindow("Mon-Fri 22:00-04:00")
	if err != nil || w.String() != "Mon,Tue,Wed,Thu,Fri 22:00-04:00 UTC" {
		t.Fatalf("%v %v", w, err)
	}
	if w, err := etcdbudget.ParseWindow("daily 00:00-24:00 UTC"); err != nil || w.String() != "daily 00:00-24:00 UTC" {
		t.Fatalf("%v %v", w, err)
	}
	for _, bad := range []string{"", "Mon", "Mon 22-04", "Mon 25:00-04:00", "Funday 01:00-02:00", "Mon 01:00-02:00 Mars/Base", "Mon 24:00-02:00", "Mo 01:00-02:00"} {
		if _, err := etcdbudget.ParseWindow(bad); err == nil {
			t.Errorf("ParseWindow(%q) accepted", bad)
		}
	}
}

// Closes: the end of the opening that contains t, past midnight and over
// whole days too; t itself outside the window; never for a window open
// all the time.
func TestWindowCloses(t *testing.T) {
	at := func(s string) time.Time {
		tm, err := time.Parse("2006-01-02 15:04", s) // UTC; 2026-12-04 is a Friday
		if err != nil {
			t.Fatal(err)
		}
		return tm
	}
	for _, c := range []struct {
		spec, t, want string // want "" for never
	}{
		{"Mon-Fri 09:00-17:00", "2026-12-04 10:00", "2026-12-04 17:00"},
		{"Mon-Fri 09:00-17:00", "2026-12-04 18:00", "2026-12-04 18:00"}, // outside
		{"Fri 22:00-04:00", "2026-12-04 23:00", "2026-12-05 04:00"},     // opened today, past midnight
		{"Fri 22:00-04:00", "2026-12-05 02:00", "2026-12-05 04:00"},     // opened yesterday
		{"Sat,Sun 00:00-24:00", "2026-12-05 10:00", "2026-12-07 00:00"}, // whole days: Monday's midnight
		{"daily 00:00-24:00", "2026-12-04 10:00", ""},
	} {
		w, err := etcdbudget.ParseWindow(c.spec)
		if err != nil {
			t.Fatal(err)
		}
		got := w.Closes(at(c.t))
		want := time.Time{}
		if c.want != "" {
			want = at(c.want)
		}
		if !got.Equal(want) {
			t.Errorf("%q.Closes(%s) = %v, want %v", c.spec, c.t, got, want)
		}
	}
}
