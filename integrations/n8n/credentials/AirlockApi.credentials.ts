import type {
	IAuthenticateGeneric,
	Icon,
	ICredentialTestRequest,
	ICredentialType,
	INodeProperties,
} from 'n8n-workflow';

export class AirlockApi implements ICredentialType {
	name = 'airlockApi';

	displayName = 'Airlock API';

	icon: Icon = { light: 'file:../nodes/Airlock/airlock.svg', dark: 'file:../nodes/Airlock/airlock.dark.svg' };

	documentationUrl = 'https://github.com/airlockhq/airlock/blob/main/docs/n8n.md#credential';

	properties: INodeProperties[] = [
		{
			displayName: 'Base URL',
			name: 'baseUrl',
			type: 'string',
			default: 'http://127.0.0.1:8080',
			placeholder: 'https://airlock.example.com',
			description: 'Where airlock serves its API, without /v1',
			required: true,
		},
		{
			displayName: 'API Key',
			name: 'apiKey',
			type: 'string',
			typeOptions: { password: true },
			default: '',
			description:
				'A key from `airlock apikey create --scope runs` (add `worker` for the worker sub-workflow). Sent as a Bearer token.',
			required: true,
		},
	];

	authenticate: IAuthenticateGeneric = {
		type: 'generic',
		properties: {
			headers: {
				Authorization: '=Bearer {{$credentials.apiKey}}',
			},
		},
	};

	// Any valid key gets 200 (its name and scopes), a wrong or revoked one 401.
	test: ICredentialTestRequest = {
		request: {
			baseURL: '={{$credentials.baseUrl}}',
			url: '/v1/whoami',
			method: 'GET',
		},
	};
}
