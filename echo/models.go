package echo

import (
	"net/http"
	"slices"

	"github.com/rationhq/ration/internal/oaierror"
)

type model struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

type modelList struct {
	Object string  `json:"object"`
	Data   []model `json:"data"`
}

func newModel(id string) model {
	return model{ID: id, Object: "model", Created: 0, OwnedBy: "ration"}
}

func (e *Engine) listModels(w http.ResponseWriter, _ *http.Request) {
	out := modelList{Object: "list", Data: make([]model, len(e.cfg.models))}
	for i, id := range e.cfg.models {
		out.Data[i] = newModel(id)
	}
	writeJSON(w, out)
}

// getModel answers GET /v1/models/{id}: the model if listed, else 404.
func (e *Engine) getModel(w http.ResponseWriter, id string) {
	if !slices.Contains(e.cfg.models, id) {
		oaierror.Write(w, http.StatusNotFound, oaierror.TypeInvalidRequest, "model_not_found", "model",
			"The model '"+id+"' does not exist; GET /v1/models lists the ones this engine serves.")
		return
	}
	writeJSON(w, newModel(id))
}
