"""The metric names read out of rule expressions: real rules' shapes, and what is not a metric."""

from pathlib import Path

from tests.support.promql_names import Rule, Selector, metric_names, scraped_selectors, selectors


def test_aggregations_ranges_offsets_and_comparisons_name_only_their_metrics() -> None:
    expr = """
      sum by (server) (rate(prefixscope_kv_blocks_removed_total[5m]))
        > 3 * sum by (server) (rate(prefixscope_kv_blocks_removed_total[1h] offset 15m))
      and sum by (server) (rate(prefixscope_kv_blocks_removed_total[5m])) > 10
    """
    assert metric_names(expr) == {"prefixscope_kv_blocks_removed_total"}


def test_vector_matching_keywords_and_their_label_lists_are_not_metrics() -> None:
    expr = """
      prefixscope:prompt_tokens:rate30m
          * on (instance) group_left (block_size, cache_dtype, prefix_caching_hash_algo)
            prefixscope:cache_config:info
        or (prefixscope:prompt_tokens:rate30m unless on (instance) prefixscope:cache_config:info)
    """
    assert metric_names(expr) == {"prefixscope:prompt_tokens:rate30m", "prefixscope:cache_config:info"}


def test_label_matchers_stay_with_their_selector_and_strings_are_not_metrics() -> None:
    expr = """
      sum by (instance, model_name) (rate(vllm:kv_block_lifetime_seconds_bucket{le="60.0"}[15m]))
        / (sum by (instance, model_name) (rate(vllm:kv_block_lifetime_seconds_count[15m])) > 0.01) > bool 0.5
      or label_replace(up{job="vllm"}, "rate", "$1", "instance", "(sum)")
    """
    assert selectors(expr) == [
        Selector("vllm:kv_block_lifetime_seconds_bucket", 'vllm:kv_block_lifetime_seconds_bucket{le="60.0"}'),
        Selector("vllm:kv_block_lifetime_seconds_count", "vllm:kv_block_lifetime_seconds_count{}"),
        Selector("up", 'up{job="vllm"}'),
    ]


def test_a_name_given_as_a_matcher_and_functions_of_time_are_read_right() -> None:
    expr = """
      time() - {__name__="prefixscope_collector_last_report_timestamp_seconds", kind!="gateway"} > 120
      or absent(up{job="prefixscope"}) or max_over_time(prefixscope_gateway_spill_file_bytes[15m:1m]) > 0
    """
    assert metric_names(expr) == {
        "prefixscope_collector_last_report_timestamp_seconds",
        "up",
        "prefixscope_gateway_spill_file_bytes",
    }


def test_names_that_rules_record_are_left_to_the_rules() -> None:
    where = Path("rules.yml")
    rules = [
        Rule(where, "g", "prefixscope:template_prompt_tokens:rate30m",
             'sum by (template) (rate(prefixscope_template_prompt_tokens_total{template!="o"}[30m]))', True),
        Rule(where, "g", "ReuseExpectedNoneDelivered",
             "prefixscope:template_prompt_tokens:rate30m > 20 and on (template) up == 1", False),
    ]  # fmt: skip
    assert [selector.name for selector in scraped_selectors(rules)] == [
        "prefixscope_template_prompt_tokens_total",
        "up",
    ]
