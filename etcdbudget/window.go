package etcdbudget

import (
	"fmt"
	"strings"
	"time"
)

// Window is a maintenance window: the days of the week and the time of
// day, in a time zone, when restarts may happen. A window whose end is
// before its start runs past midnight ("Fri 22:00-04:00" ends on Saturday
// at 04:00); its days are the days it starts on. Start equal to End means
// the whole day.
type Window struct {
	// Days are the weekdays the window opens on.
	Days [7]bool
	// Start and End are minutes after midnight, in Location.
	Start, End int
	// Location is the window's time zone (nil: UTC).
	Location *time.Location
}

// ParseWindow parses a window such as "Mon-Fri 22:00-04:00 Europe/Berlin",
// "Sat,Sun 00:00-24:00 UTC" or "daily 01:00-05:00" (time zone: UTC when
// left out; "Local" is the machine's). Days: names (Mon…Sun, any case, 3
// letters or more), ranges (Mon-Fri, Fri-Mon wraps), lists joined with
// commas, or "daily".
func ParseWindow(spec string) (*Window, error) {
	f := strings.Fields(spec)
	if len(f) < 2 || len(f) > 3 {
		return nil, fmt.Errorf("window %q: want DAYS HH:MM-HH:MM [TIMEZONE], e.g. \"Mon-Fri 22:00-04:00 Europe/Berlin\"", spec)
	}
	w := &Window{Location: time.UTC}
	if err := w.parseDays(f[0]); err != nil {
		return nil, fmt.Errorf("window %q: %w", spec, err)
	}
	from, to, ok := strings.Cut(f[1], "-")
	var err error
	if !ok {
		return nil, fmt.Errorf("window %q: times %q: want HH:MM-HH:MM", spec, f[1])
	}
	if w.Start, err = clockMinutes(from); err != nil {
		return nil, fmt.Errorf("window %q: %w", spec, err)
	}
	if w.End, err = clockMinutes(to); err != nil {
		return nil, fmt.Errorf("window %q: %w", spec, err)
	}
	if w.Start == 24*60 {
		return nil, fmt.Errorf("window %q: a window cannot start at 24:00", spec)
	}
	if w.End == 24*60 {
		w.End = 0 // midnight; 00:00-24:00 is the whole day
	}
	if len(f) == 3 {
		if w.Location, err = time.LoadLocation(f[2]); err != nil {
			return nil, fmt.Errorf("window %q: time zone: %w", spec, err)
		}
	}
	return w, nil
}

func (w *Window) parseDays(s string) error {
	if strings.EqualFold(s, "daily") || s == "*" {
		for i := range w.Days {
			w.Days[i] = true
		}
		return nil
	}
	for part := range strings.SplitSeq(s, ",") {
		a, b, isRange := strings.Cut(part, "-")
		from, err := weekday(a)
		if err != nil {
			return err
		}
		to := from
		if isRange {
			if to, err = weekday(b); err != nil {
				return err
			}
		}
		for d := from; ; d = (d + 1) % 7 {
			w.Days[d] = true
			if d == to {
				break
			}
		}
	}
	return nil
}

func weekday(s string) (int, error) {
	l := strings.ToLower(strings.TrimSpace(s))
	for i := range 7 {
		if len(l) >= 3 && strings.HasPrefix(strings.ToLower(time.Weekday(i).String()), l) {
			return i, nil
		}
	}
	return 0, fmt.Errorf("unknown day %q (want Mon, Tue, …, Sun)", s)
}

func clockMinutes(s string) (int, error) {
	var h, m int
	if n, err := fmt.Sscanf(s, "%d:%d", &h, &m); err != nil || n != 2 || len(s) != 5 || h < 0 || m < 0 || m > 59 || h > 24 || (h == 24 && m != 0) {
		return 0, fmt.Errorf("time %q: want HH:MM, 00:00 to 24:00", s)
	}
	return h*60 + m, nil
}

func (w *Window) loc() *time.Location {
	if w.Location == nil {
		return time.UTC
	}
	return w.Location
}

// Contains reports whether t falls inside the window.
func (w *Window) Contains(t time.Time) bool {
	lt := t.In(w.loc())
	m := lt.Hour()*60 + lt.Minute()
	day := int(lt.Weekday())
	prev := (day + 6) % 7
	switch {
	case w.Start == w.End:
		return w.Days[day]
	case w.Start < w.End:
		return w.Days[day] && m >= w.Start && m < w.End
	default: // past midnight
		return (w.Days[day] && m >= w.Start) || (w.Days[prev] && m < w.End)
	}
}

// Next returns t when t is inside the window, else the window's next
// opening after t.
func (w *Window) Next(t time.Time) time.Time {
	if w.Contains(t) {
		return t
	}
	lt := t.In(w.loc())
	for i := 0; i <= 7; i++ {
		open := time.Date(lt.Year(), lt.Month(), lt.Day()+i, w.Start/60, w.Start%60, 0, 0, w.loc())
		if w.Days[open.Weekday()] && open.After(t) {
			return open
		}
	}
	return time.Time{} // no day at all: never
}

// Closes returns when the opening of the window that contains t closes:
// t itself when t is outside the window, the zero time when the window
// never closes (the whole day, every day).
func (w *Window) Closes(t time.Time) time.Time {
	if !w.Contains(t) {
		return t
	}
	loc := w.loc()
	lt := t.In(loc)
	y, mo, d := lt.Date()
	at := func(days, minutes int) time.Time {
		return time.Date(y, mo, d+days, minutes/60, minutes%60, 0, 0, loc)
	}
	switch {
	case w.Start == w.End: // whole days: the first midnight of a day it does not open on
		for i := 1; i <= 7; i++ {
			if mid := at(i, 0); !w.Days[mid.Weekday()] {
				return mid
			}
		}
		return time.Time{}
	case w.Start < w.End:
		return at(0, w.End)
	case w.Days[lt.Weekday()] && lt.Hour()*60+lt.Minute() >= w.Start: // opened today, past midnight
		return at(1, w.End)
	default: // opened yesterday
		return at(0, w.End)
	}
}

// String returns the window in ParseWindow's form.
func (w *Window) String() string {
	var days []string
	for i, on := range w.Days {
		if on {
			days = append(days, time.Weekday(i).String()[:3])
		}
	}
	if len(days) == 7 {
		days = []string{"daily"}
	}
	end := w.End
	if end == 0 && w.Start == 0 {
		end = 24 * 60
	}
	return fmt.Sprintf("%s %02d:%02d-%02d:%02d %s", strings.Join(days, ","), w.Start/60, w.Start%60, end/60, end%60, w.loc())
}
