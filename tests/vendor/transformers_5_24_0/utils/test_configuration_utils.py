"""Stub: transformers' `config_common_kwargs` (tests/utils/test_configuration_utils.py of its repository), the
values `ConfigTester` sets on a config to check they round-trip."""

config_common_kwargs = {'return_dict': False, 'output_hidden_states': True, 'output_attentions': True,
                        'dtype': 'float16', 'chunk_size_feed_forward': 5, 'architectures': ['BertModel'],
                        'id2label': {0: 'label'}, 'label2id': {'label': '0'}, 'problem_type': 'regression'}
