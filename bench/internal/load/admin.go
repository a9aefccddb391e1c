package load

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/seckill/seckill/internal/verify"
)

// Sale is what PUT /admin/v1/activities/{id} takes.
type Sale struct {
	ID           int64
	Stock        int
	PerUserLimit int
	StartsAt     time.Time
	EndsAt       time.Time
}

var httpClient = &http.Client{Timeout: 10 * time.Second}

// CreateSale creates (or updates) the sale through the backend's admin API.
func CreateSale(ctx context.Context, adminURL, token string, s Sale) error {
	body, err := json.Marshal(map[string]any{
		"stock":          s.Stock,
		"per_user_limit": s.PerUserLimit,
		"starts_at":      s.StartsAt.UTC().Format(time.RFC3339Nano),
		"ends_at":        s.EndsAt.UTC().Format(time.RFC3339Nano),
	})
	if err != nil {
		return err
	}
	u := fmt.Sprintf("%s/admin/v1/activities/%d", trimSlash(adminURL), s.ID)
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, u, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := httpClient.Do(req)
	if err != nil {
		return fmt.Errorf("create sale: %w", err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	switch resp.StatusCode {
	case http.StatusOK, http.StatusCreated:
		return nil
	case http.StatusUnauthorized, http.StatusForbidden:
		return fmt.Errorf("create sale: PUT %s: %s (check -admin-token / SECKILL_ADMIN_TOKEN): %s", u, resp.Status, bytes.TrimSpace(msg))
	default:
		return fmt.Errorf("create sale: PUT %s: %s: %s", u, resp.Status, bytes.TrimSpace(msg))
	}
}

// FetchState reads GET /api/v1/activities/{id} from base (the backend).
func FetchState(ctx context.Context, base string, id int64) (verify.APIState, error) {
	var st verify.APIState
	u := fmt.Sprintf("%s/api/v1/activities/%d", trimSlash(base), id)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return st, err
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return st, fmt.Errorf("read sale state: %w", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode != http.StatusOK {
		return st, fmt.Errorf("read sale state: GET %s: %s: %s", u, resp.Status, bytes.TrimSpace(b))
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, fmt.Errorf("read sale state: GET %s: %w", u, err)
	}
	return st, nil
}
