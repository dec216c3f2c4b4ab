variable "project" {
  description = "Google Cloud project ID"
  type        = string
}

variable "region" {
  description = "Region of the bucket, the repositories and the pipeline runs"
  type        = string
  default     = "us-central1"
}

variable "bucket" {
  description = "Name of the pipeline-root bucket (globally unique)"
  type        = string
}

variable "docker_repo" {
  description = "Artifact Registry Docker repository for the detpipe image"
  type        = string
  default     = "detpipe"
}

variable "kfp_repo" {
  description = "Artifact Registry KFP repository for pipeline templates"
  type        = string
  default     = "detpipe-templates"
}

variable "artifact_retention_days" {
  description = "Delete pipeline artifacts older than this many days"
  type        = number
  default     = 30
}
