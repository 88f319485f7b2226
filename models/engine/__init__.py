"""The step loop: requests in through its inbox, one batched step at a time, outputs out."""
