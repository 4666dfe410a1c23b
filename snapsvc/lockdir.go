package snapsvc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/snapsvc/snapsvc/internal/flock"
	"github.com/snapsvc/snapsvc/internal/snapd"
)

// Where a snap's lock directory is (share.go says what is in it). Every
// process that controls a snap must find the same directory for it,
// whoever runs it: the snap's own daemons and hooks, and an operator's CLI
// on the host. So with snapd's own sockets the directory is the snap's:
// $SNAP_COMMON/.snapsvc-lock, which is /var/snap/SNAP/common/.snapsvc-lock
// on the host too (snapd's dirs.SnapDataCommonDir; the default AppArmor
// template lets a strictly confined snap read, lock, write and link there:
// interfaces/apparmor/template.go, @{SNAP_COMMON}/** wl). Outside a snap,
// root uses it where the snap is installed, and /run/snapsvc otherwise
// (root's alone: not /run/lock, where any user could create the directory
// first and lock root out); another user, a directory of its own in the
// temporary directory. A snapd that is not the system's (a fake, a socket
// named by WithSocket) gets one directory beside its socket, and
// WithLockDir names one for every snap.

// lockDirs says where each snap's lock directory is, and watches them.
type lockDirs struct {
	fixed   string                   // every snap's ("" with perSnap nil: no lock directory)
	perSnap func(snap string) string // the system's snapd: each snap's own
	scan    func() []string          // the system's snapd: every directory perSnap may name, now

	mu      sync.Mutex
	watches map[string]*dirWatch
	closed  bool
	paths   sync.Map // snap -> *snapPaths, once its directory is known for good
}

// snapPaths are the files of one snap in its lock directory.
type snapPaths struct {
	dir, lock, wait, peers string
}

// snapDataDir is snapd's dirs.SnapDataDir, the parent of every snap's
// SNAP_COMMON (export_test.go points it elsewhere).
var snapDataDir = "/var/snap"

// lockDirEuid is os.Geteuid (export_test.go replaces it).
var lockDirEuid = os.Geteuid

// defaultLockDirs are the lock directories of a Client acting through
// socket, in the environment env (see above).
func defaultLockDirs(socket string, env func(string) string) *lockDirs {
	if socket != snapd.DefaultSocket && socket != snapd.DefaultSnapSocket {
		return &lockDirs{fixed: filepath.Join(instanceKey(socket), ".snapsvc-lock")}
	}
	own := env("SNAP_INSTANCE_NAME")
	if own == "" {
		own = env("SNAP_NAME")
	}
	ownCommon := ""
	if common := env("SNAP_COMMON"); common != "" && own != "" {
		ownCommon = filepath.Join(common, ".snapsvc-lock")
	}
	euid := lockDirEuid()
	scan := func() []string {
		if euid != 0 {
			return []string{filepath.Join(os.TempDir(), fmt.Sprintf("snapsvc-%d", euid))}
		}
		dirs, _ := filepath.Glob(filepath.Join(snapDataDir, "*", "common", ".snapsvc-lock"))
		return append(dirs, "/run/snapsvc")
	}
	return &lockDirs{scan: scan, perSnap: func(snap string) string {
		if snap == own && ownCommon != "" {
			return ownCommon
		}
		if euid == 0 {
			common := filepath.Join(snapDataDir, snap, "common")
			if st, err := os.Stat(common); err == nil && st.IsDir() {
				return filepath.Join(common, ".snapsvc-lock")
			}
			return "/run/snapsvc"
		}
		if ownCommon != "" {
			return ownCommon // a snap's process that is not root: its own directory for every snap
		}
		return filepath.Join(os.TempDir(), fmt.Sprintf("snapsvc-%d", euid))
	}}
}

// scanned lists every lock directory of the Client's snaps that exists
// now: the fixed one, or, for the system's snapd, every snap's.
func (d *lockDirs) scanned() []string {
	switch {
	case d.none():
		return nil
	case d.fixed != "":
		return []string{d.fixed}
	case d.scan != nil:
		return d.scan()
	}
	return nil
}

// none reports whether there is no lock directory (WithoutFileLock).
func (d *lockDirs) none() bool { return d == nil || (d.fixed == "" && d.perSnap == nil) }

// of returns snap's lock directory ("": none).
func (d *lockDirs) of(snap string) string {
	switch {
	case d.none():
		return ""
	case d.perSnap != nil:
		return d.perSnap(snap)
	}
	return d.fixed
}

// lockDirEvents are the events of a lock directory's watch: a record
// rewritten (a beat, new facts, a flight's phase), let go of (the close of
// its holder's file, which a process's death closes too), made or removed.
const lockDirEvents = unix.IN_MOVED_TO | unix.IN_CLOSE_WRITE | unix.IN_MODIFY | unix.IN_DELETE | unix.IN_CREATE

// isRecord reports whether name is one of the records a watch of the lock
// directory reports. A record made whole under a temporary name, then
// linked (flock.Create), is written by its holder through the descriptor
// it was made with, and the kernel names those writes by the temporary
// name (".SNAP.wait.tmp-PID-N"), removed once linked: they count too, or
// a follower would miss every rewrite of its watcher's facts but for
// other records' events (a joiner of eight waited 100 ms, its poll, for
// its leader's outcome, 2 runs in 60 under load).
func isRecord(name string) bool {
	if strings.HasPrefix(name, ".") {
		i := strings.Index(name, ".tmp-")
		if i < 0 {
			return false
		}
		name = name[1:i]
	}
	return strings.HasSuffix(name, lockSuffix) || strings.HasSuffix(name, waitSuffix) || strings.HasSuffix(name, flightSuffix)
}

// watch returns the watch of snap's lock directory (one per directory and
// Client, opened at its first wait, ended by Close); nil without one.
func (d *lockDirs) watch(snap string) *dirWatch {
	dir := d.of(snap)
	if dir == "" {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.watches == nil {
		d.watches = map[string]*dirWatch{}
	}
	w := d.watches[dir]
	if w == nil {
		w = newDirWatch(dir, lockDirEvents, isRecord)
		if d.closed {
			w.close() // Close came first: it never opens
		}
		d.watches[dir] = w
	}
	return w
}

// close ends the directories' watches (Client.Close).
func (d *lockDirs) close() {
	if d == nil {
		return
	}
	d.mu.Lock()
	d.closed = true
	ws := make([]*dirWatch, 0, len(d.watches))
	for _, w := range d.watches {
		ws = append(ws, w)
	}
	d.mu.Unlock()
	for _, w := range ws {
		w.close()
	}
}

const (
	lockSuffix   = ".lock"
	waitSuffix   = ".wait"
	flightSuffix = ".flight"
	peersSuffix  = ".peers"
)

// path is the file of snap with suffix in its lock directory.
func (d *lockDirs) path(snap, suffix string) string {
	p := d.files(snap)
	switch suffix {
	case lockSuffix:
		return p.lock
	case waitSuffix:
		return p.wait
	case peersSuffix:
		return p.peers
	}
	return filepath.Join(p.dir, snap+suffix)
}

// files returns snap's files, remembered once its directory is known for
// good: a fixed one, or the snap's own (a snap not installed yet has
// /run/snapsvc's until it is, so that one is worked out every time).
func (d *lockDirs) files(snap string) *snapPaths {
	if p, ok := d.paths.Load(snap); ok {
		return p.(*snapPaths)
	}
	dir := d.of(snap)
	p := &snapPaths{dir: dir, lock: filepath.Join(dir, snap+lockSuffix), wait: filepath.Join(dir, snap+waitSuffix), peers: filepath.Join(dir, snap+peersSuffix)}
	if d.perSnap == nil || strings.HasSuffix(dir, ".snapsvc-lock") {
		d.paths.Store(snap, p)
	}
	return p
}

// snapLockBody is what the holder of a snap's lock says of itself.
type snapLockBody struct {
	For string `json:"for,omitempty"` // what it does: "restart k8s.kubelet"
}

// lockSnap takes snap's cross-process lock as a record this process holds
// (records.go), its body what (snapLockBody: what the holder does): while another
// peer holds it, it waits within ctx (waiting, when set, is called before
// it first waits, with what the holder's record says it does; its error
// ends the wait), woken by the directory's watch when the
// holder lets go (its close) or beats, looking every peerLook at most, and
// deposes a holder that stopped beating. A lock file that holds no record
// (an earlier release's) is waited for as it always was.
func (d *lockDirs) lockSnap(ctx context.Context, snap string, what []byte, waiting func(holder []byte) error) (*heldRecord, error) {
	path := d.path(snap, lockSuffix)
	w := d.watch(snap)
	con, err := flock.Contend(path)
	if err != nil {
		return nil, err
	}
	defer func() { con.Close() }()
	var bw beatWatch
	for {
		var mark uint64
		watched := w.open()
		if watched {
			mark = w.mark()
		}
		l, ok, err := con.Try()
		switch {
		case err != nil:
			return nil, err
		case ok && !l.Same():
			// A holder judged stopped was deposed after this contender
			// opened the file: the lock is now another file's.
			_ = l.Unlock()
		case ok:
			return holdRecord(l, what)
		case !con.Same():
			// The file was removed (its holder deposed): contend for
			// the one that replaces it.
		default:
			f, ok := readFrame(con.Read)
			if ok && f.thisBoot() && bw.silent(f) {
				if err := d.deposeSilent(ctx, snap, path, bw); err != nil {
					return nil, err
				}
				continue
			}
			if waiting != nil {
				testHookLockWait(snap)
				if err := waiting(f.Body); err != nil {
					return nil, err
				}
				waiting = nil
			}
			if err := awaitDir(ctx, w, watched, mark, peerLook); err != nil {
				return nil, fmt.Errorf("waiting for lock %s: %w", path, err)
			}
			continue
		}
		con.Close()
		if con, err = flock.Contend(path); err != nil {
			return nil, err
		}
	}
}

// testHookLockWait is called as an operation begins to wait for snap's
// lock, which another process holds (export_test.go).
var testHookLockWait = func(snap string) {}

// deposeSilent removes snap's lock file at path, whose holder bw saw
// silent, once checked again under the snap's peers lock.
func (d *lockDirs) deposeSilent(ctx context.Context, snap, path string, bw beatWatch) error {
	p, err := openPeer(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer p.close()
	p.bw = bw
	_, err = p.depose(ctx, d.path(snap, peersSuffix))
	return err
}

// awaitDir waits for an event in a lock directory after mark (watched:
// its watch works, else it sleeps), at most d, or ctx's end (its error).
func awaitDir(ctx context.Context, w *dirWatch, watched bool, mark uint64, d time.Duration) error {
	if watched {
		if _, err := w.waitFrom(ctx, d, mark); err == nil || ctx.Err() != nil {
			return ctx.Err()
		}
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
