package fence_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"testing"

	_ "modernc.org/sqlite" // pure-Go SQLite driver "sqlite"
)

// errStaleRow: the row holds a greater token than the writer's.
var errStaleRow = errors.New("stale fencing token: a newer lock holder has written this row")

// fencedPut is the SQL pattern: one statement writes the row only if the
// stored token is not greater than the writer's, so the check and the write
// are atomic in the database. The row keeps the greatest token that wrote
// it; zero rows changed means the writer's token is stale.
func fencedPut(ctx context.Context, db *sql.DB, key, value string, token int64) error {
	res, err := db.ExecContext(ctx, `
		INSERT INTO objects (key, value, fence_token) VALUES ($1, $2, $3)
		ON CONFLICT (key) DO UPDATE SET value = excluded.value, fence_token = excluded.fence_token
		WHERE objects.fence_token <= excluded.fence_token`, key, value, token)
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil {
		return err
	} else if n == 0 {
		return errStaleRow
	}
	return nil
}

func openDB(t testing.TB) *sql.DB {
	db, err := sql.Open("sqlite", "file:"+t.TempDir()+"/objects.db?_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE objects (key TEXT PRIMARY KEY, value TEXT NOT NULL, fence_token INTEGER NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return db
}

// A stale writer (token 7) loses to the holder that replaced it (token 9),
// in every order, and the row ends with the greatest token's value.
func TestSQLPattern(t *testing.T) {
	db := openDB(t)
	defer db.Close()
	ctx := context.Background()
	if err := fencedPut(ctx, db, "report", "by 9", 9); err != nil {
		t.Fatal(err)
	}
	if err := fencedPut(ctx, db, "report", "by 7 (paused)", 7); !errors.Is(err, errStaleRow) {
		t.Fatalf("stale write: %v, want refused", err)
	}
	if err := fencedPut(ctx, db, "report", "by 9 again", 9); err != nil {
		t.Fatalf("same token again: %v", err)
	}
	if err := fencedPut(ctx, db, "other", "by 7", 7); err != nil {
		t.Fatalf("another row is independent: %v", err)
	}

	// Concurrent writers with tokens 1..40: whatever the interleaving, the
	// accepted writes come in non-decreasing token order per row and the
	// row ends with token 40's value.
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		accepted []int64
	)
	for tok := int64(1); tok <= 40; tok++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := fencedPut(ctx, db, "race", fmt.Sprint("by ", tok), tok)
			if err == nil {
				mu.Lock()
				accepted = append(accepted, tok)
				mu.Unlock()
			} else if !errors.Is(err, errStaleRow) {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	var (
		value string
		token int64
	)
	if err := db.QueryRow(`SELECT value, fence_token FROM objects WHERE key = 'race'`).Scan(&value, &token); err != nil {
		t.Fatal(err)
	}
	if token != 40 || value != "by 40" {
		t.Fatalf("row = %q token %d, want token 40's write", value, token)
	}
	if len(accepted) == 0 {
		t.Fatal("no write accepted")
	}
}

// The SQL pattern on SQLite: the holder with token 9 wrote, then the paused
// holder with token 7 woke up and tried to write: refused.
func Example_sql() {
	db, err := sql.Open("sqlite", ":memory:")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer db.Close()
	db.SetMaxOpenConns(1) // one in-memory database
	_, _ = db.Exec(`CREATE TABLE objects (key TEXT PRIMARY KEY, value TEXT NOT NULL, fence_token INTEGER NOT NULL)`)
	ctx := context.Background()

	fmt.Println(fencedPut(ctx, db, "report", "by 9", 9))
	fmt.Println(fencedPut(ctx, db, "report", "by 7", 7))
	var value string
	_ = db.QueryRow(`SELECT value FROM objects WHERE key = 'report'`).Scan(&value)
	fmt.Println(value)
	// Output:
	// <nil>
	// stale fencing token: a newer lock holder has written this row
	// by 9
}
